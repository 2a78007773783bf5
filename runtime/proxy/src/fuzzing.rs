//! The proxy's reading of a client's first bytes without a socket: the same dispatch on the
//! first byte as [`crate::Proxy`] (`0x05` SOCKS5, an ASCII letter HTTP), the same bounded
//! HTTP head reader and the same SOCKS5 handshake. Public for the fuzz targets in `fuzz/`
//! and their regression test; the proxy itself does not call it.

use tokio::io::{AsyncRead, AsyncWrite};

use crate::http::{self, HttpError, Request};
use crate::rules::Host;
use crate::socks::{self, SocksError};

/// What a client's first bytes ask for.
#[derive(Debug)]
pub enum FirstRequest {
    /// `CONNECT host:port`.
    Connect { host: Host, port: u16 },
    /// An absolute-form HTTP request; `head` is the head rewritten for the origin.
    Forward {
        host: Host,
        port: u16,
        head: Vec<u8>,
    },
    /// A SOCKS5 CONNECT.
    Socks { host: Host, port: u16 },
    /// Neither protocol (the proxy answers 400, or a SOCKS4 rejection for `0x04`).
    Unrecognised { first: u8 },
}

/// Why the first bytes were refused.
#[derive(Debug, thiserror::Error)]
pub enum FirstRequestError {
    #[error("http request refused")]
    Http(#[source] HttpError),
    #[error("socks5 handshake refused")]
    Socks(#[source] SocksError),
}

/// Reads the first request from `stream`, whose first byte is `first` (the proxy peeks it;
/// here the caller passes it and `stream` still starts with it).
pub async fn first_request<S: AsyncRead + AsyncWrite + Unpin>(
    first: u8,
    stream: &mut S,
    head_limit: usize,
) -> Result<FirstRequest, FirstRequestError> {
    match first {
        0x05 => socks::handshake(stream)
            .await
            .map(|(host, port)| FirstRequest::Socks { host, port })
            .map_err(FirstRequestError::Socks),
        b if b.is_ascii_alphabetic() => match http::read_request(stream, head_limit).await {
            Ok(Request::Connect { host, port, .. }) => Ok(FirstRequest::Connect { host, port }),
            Ok(Request::Forward {
                host, port, head, ..
            }) => Ok(FirstRequest::Forward {
                host,
                port,
                head: head.encode(None),
            }),
            Err(e) => Err(FirstRequestError::Http(e)),
        },
        other => Ok(FirstRequest::Unrecognised { first: other }),
    }
}
