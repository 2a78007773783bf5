//! The SOCKS5 handshake (RFC 1928), server side, `CONNECT` only, no authentication.
//!
//! Written here rather than taken from a crate: the protocol part the proxy needs is three
//! fixed-layout messages (about a hundred lines), and the SOCKS5 server crates on crates.io
//! either resolve and dial by themselves (the proxy must resolve once, check the address, and
//! dial exactly that address) or are thinly maintained. Keeping it here keeps every decision in
//! `Proxy::open`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::rules::{Host, HostError};

const VERSION: u8 = 0x05;
const NO_AUTH: u8 = 0x00;
const NO_ACCEPTABLE_METHOD: u8 = 0xff;
const CMD_CONNECT: u8 = 0x01;
const ATYP_V4: u8 = 0x01;
const ATYP_DOMAIN: u8 = 0x03;
const ATYP_V6: u8 = 0x04;

/// SOCKS5 reply codes (RFC 1928 §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Reply {
    Succeeded = 0x00,
    GeneralFailure = 0x01,
    NotAllowed = 0x02,
    NetworkUnreachable = 0x03,
    HostUnreachable = 0x04,
    ConnectionRefused = 0x05,
    CommandNotSupported = 0x07,
    AddressTypeNotSupported = 0x08,
}

/// Why a SOCKS5 handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum SocksError {
    /// Reading or writing the handshake failed.
    #[error("socks5 handshake i/o failed")]
    Io(#[from] std::io::Error),
    /// The first byte was not version 5.
    #[error("unsupported socks version {version}")]
    Version {
        /// The version byte sent.
        version: u8,
    },
    /// The client offered no method the proxy accepts (only "no authentication" is).
    #[error("client offers no acceptable socks5 authentication method")]
    NoAcceptableMethod,
    /// A command other than `CONNECT`.
    #[error("socks5 command {command:#04x} is not supported, only CONNECT is")]
    Command {
        /// The command byte.
        command: u8,
    },
    /// An unknown address type.
    #[error("socks5 address type {atyp:#04x} is not supported")]
    AddressType {
        /// The type byte.
        atyp: u8,
    },
    /// The domain is not a valid host name.
    #[error("socks5 domain is invalid")]
    BadHost(#[source] HostError),
}

impl SocksError {
    /// The reply the client gets, if the handshake got far enough for one.
    pub(crate) fn reply(&self) -> Option<Reply> {
        match self {
            Self::Command { .. } => Some(Reply::CommandNotSupported),
            Self::AddressType { .. } => Some(Reply::AddressTypeNotSupported),
            Self::BadHost(_) => Some(Reply::GeneralFailure),
            Self::Io(_) | Self::Version { .. } | Self::NoAcceptableMethod => None,
        }
    }
}

/// Runs the method negotiation and reads the request. Returns the requested target; the caller
/// then answers with [`write_reply`].
pub(crate) async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
) -> Result<(Host, u16), SocksError> {
    let mut head = [0u8; 2];
    stream.read_exact(&mut head).await?;
    let [version, nmethods] = head;
    if version != VERSION {
        return Err(SocksError::Version { version });
    }
    let mut methods = vec![0u8; usize::from(nmethods)];
    stream.read_exact(&mut methods).await?;
    if !methods.contains(&NO_AUTH) {
        stream.write_all(&[VERSION, NO_ACCEPTABLE_METHOD]).await?;
        return Err(SocksError::NoAcceptableMethod);
    }
    stream.write_all(&[VERSION, NO_AUTH]).await?;

    let mut req = [0u8; 4];
    stream.read_exact(&mut req).await?;
    let [version, command, _reserved, atyp] = req;
    if version != VERSION {
        return Err(SocksError::Version { version });
    }
    // Read the address before judging the command, so the reply lands on a clean stream.
    let host = match atyp {
        ATYP_V4 => {
            let mut a = [0u8; 4];
            stream.read_exact(&mut a).await?;
            Host::Ip(IpAddr::V4(Ipv4Addr::from(a)))
        }
        ATYP_V6 => {
            let mut a = [0u8; 16];
            stream.read_exact(&mut a).await?;
            Host::Ip(IpAddr::V6(Ipv6Addr::from(a)))
        }
        ATYP_DOMAIN => {
            let mut len = [0u8; 1];
            stream.read_exact(&mut len).await?;
            let mut name = vec![0u8; usize::from(len[0])];
            stream.read_exact(&mut name).await?;
            let name = String::from_utf8(name).map_err(|_| {
                SocksError::BadHost(HostError::BadCharacter {
                    host: String::new(),
                })
            })?;
            Host::parse(&name).map_err(SocksError::BadHost)?
        }
        other => return Err(SocksError::AddressType { atyp: other }),
    };
    let mut port = [0u8; 2];
    stream.read_exact(&mut port).await?;
    if command != CMD_CONNECT {
        return Err(SocksError::Command { command });
    }
    Ok((host, u16::from_be_bytes(port)))
}

/// Sends a reply. The bound address is always `0.0.0.0:0`: the host-side address of the
/// upstream socket is none of the sandbox's business, and clients do not need it for CONNECT.
pub(crate) async fn write_reply<S: AsyncWrite + Unpin>(
    stream: &mut S,
    reply: Reply,
) -> std::io::Result<()> {
    stream
        .write_all(&[VERSION, reply as u8, 0x00, ATYP_V4, 0, 0, 0, 0, 0, 0])
        .await
}
