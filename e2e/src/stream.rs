//! The client half of kubelet's streaming path, behind `kubectl exec -it` and `kubectl
//! attach`: the CRI `Exec` / `Attach` call returns a one-time URL on containerd's streaming
//! server, and the client upgrades that URL to a WebSocket speaking Kubernetes' channel
//! protocol `v4.channel.k8s.io`. Every binary message starts with a channel byte: 0 stdin,
//! 1 stdout, 2 stderr, 3 error (at the end, a JSON `Status` carrying the exit code), 4 resize
//! (JSON `{"Width":..,"Height":..}`). containerd's server also speaks SPDY, which kubelet
//! proxies for kubectl; there is no SPDY client crate, and the server runs the same exec or
//! attach whichever framing carries the bytes.
//!
//! The WebSocket framing and handshake come from `tungstenite`; only the channel byte and
//! the status document are handled here.

use std::io::ErrorKind;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tungstenite::client::IntoClientRequest;
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

/// The channel protocol (the newest one containerd 1.6's streaming server offers).
pub const PROTOCOL: &str = "v4.channel.k8s.io";

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;

/// One open exec or attach stream.
pub struct Session {
    url: String,
    ws: WebSocket<MaybeTlsStream<TcpStream>>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    status: Option<serde_json::Value>,
    closed: bool,
}

/// What a finished stream carried.
#[derive(Debug)]
pub struct Finished {
    pub stdout: String,
    pub stderr: String,
    /// From the error channel's status: 0 for `Success`, else the `ExitCode` cause.
    pub exit_code: Option<i32>,
    /// The status document itself (absent if the server closed without one).
    pub status: Option<serde_json::Value>,
}

impl std::fmt::Display for Finished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit code {:?}\n--- stdout\n{}\n--- stderr\n{}\n--- status\n{}",
            self.exit_code,
            self.stdout,
            self.stderr,
            self.status
                .as_ref()
                .map_or_else(|| "(none)".to_owned(), |s| s.to_string())
        )
    }
}

impl Session {
    /// Upgrades `url` (from a CRI Exec or Attach response) to a channel-protocol WebSocket.
    pub fn connect(url: &str) -> anyhow::Result<Self> {
        // The server hands out an http:// URL; the WebSocket upgrade is a GET of that URL,
        // which tungstenite spells ws://.
        let ws_url = match url.strip_prefix("http://") {
            Some(rest) => format!("ws://{rest}"),
            None => url.to_owned(),
        };
        let mut request = ws_url
            .into_client_request()
            .with_context(|| format!("streaming URL {url:?}"))?;
        request
            .headers_mut()
            .insert("Sec-WebSocket-Protocol", PROTOCOL.parse()?);
        let (ws, response) = tungstenite::connect(request)
            .with_context(|| format!("cannot open the WebSocket stream at {url}"))?;
        let agreed = response
            .headers()
            .get("Sec-WebSocket-Protocol")
            .and_then(|v| v.to_str().ok());
        if agreed != Some(PROTOCOL) {
            bail!("streaming server at {url} agreed on protocol {agreed:?}, not {PROTOCOL}");
        }
        Ok(Self {
            url: url.to_owned(),
            ws,
            stdout: Vec::new(),
            stderr: Vec::new(),
            status: None,
            closed: false,
        })
    }

    fn send(&mut self, channel: u8, data: &[u8]) -> anyhow::Result<()> {
        let mut message = Vec::with_capacity(data.len() + 1);
        message.push(channel);
        message.extend_from_slice(data);
        self.ws
            .send(Message::Binary(message.into()))
            .with_context(|| format!("cannot write channel {channel} of {}", self.url))
    }

    /// Writes `data` to the process's stdin.
    pub fn stdin(&mut self, data: &[u8]) -> anyhow::Result<()> {
        self.send(STDIN, data)
    }

    /// Resizes the terminal of a `tty` stream.
    pub fn resize(&mut self, width: u16, height: u16) -> anyhow::Result<()> {
        let size = serde_json::json!({ "Width": width, "Height": height });
        self.send(RESIZE, size.to_string().as_bytes())
    }

    /// The stdout received so far (lossy UTF-8).
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// Reads messages until `done(stdout so far)` holds or the server closes the stream;
    /// an error after `timeout`.
    pub fn read_until(
        &mut self,
        timeout: Duration,
        done: impl Fn(&str) -> bool,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        while !self.closed && !done(&self.stdout_text()) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!(
                    "stream {} gave no awaited output within {timeout:?}; stdout so far:\n{}",
                    self.url,
                    self.stdout_text()
                );
            }
            self.read_one(left.min(Duration::from_millis(200)))?;
        }
        Ok(())
    }

    /// One message (or nothing within `wait`).
    fn read_one(&mut self, wait: Duration) -> anyhow::Result<()> {
        if let MaybeTlsStream::Plain(tcp) = self.ws.get_mut() {
            tcp.set_read_timeout(Some(wait))?;
        }
        let message = match self.ws.read() {
            Ok(m) => m,
            Err(tungstenite::Error::Io(e))
                if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
            {
                return Ok(());
            }
            Err(tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed) => {
                self.closed = true;
                return Ok(());
            }
            Err(e) => return Err(e).with_context(|| format!("reading stream {}", self.url)),
        };
        match message {
            Message::Binary(data) => {
                let Some((&channel, payload)) = data.split_first() else {
                    return Ok(());
                };
                match channel {
                    STDOUT => self.stdout.extend_from_slice(payload),
                    STDERR => self.stderr.extend_from_slice(payload),
                    ERROR if !payload.is_empty() => {
                        self.status = Some(serde_json::from_slice(payload).with_context(|| {
                            format!(
                                "status on the error channel of {}: {}",
                                self.url,
                                String::from_utf8_lossy(payload)
                            )
                        })?);
                    }
                    _ => {}
                }
            }
            Message::Close(_) => self.closed = true,
            _ => {}
        }
        Ok(())
    }

    /// Reads to the end of the stream (at most `timeout`) and returns what it carried.
    pub fn finish(mut self, timeout: Duration) -> anyhow::Result<Finished> {
        self.read_until(timeout, |_| false)?;
        let exit_code = self.status.as_ref().map(exit_code).transpose()?;
        Ok(Finished {
            stdout: String::from_utf8_lossy(&self.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&self.stderr).into_owned(),
            exit_code,
            status: self.status,
        })
    }
}

/// The exit code a `v4.channel.k8s.io` status reports: `Success` is 0; a non-zero exit is
/// `Failure` with reason `NonZeroExitCode` and a cause of reason `ExitCode`.
fn exit_code(status: &serde_json::Value) -> anyhow::Result<i32> {
    if status["status"] == "Success" {
        return Ok(0);
    }
    let causes = status["details"]["causes"].as_array();
    let code = causes
        .into_iter()
        .flatten()
        .find(|c| c["reason"] == "ExitCode")
        .and_then(|c| c["message"].as_str())
        .with_context(|| format!("status without an exit code: {status}"))?;
    code.parse()
        .with_context(|| format!("exit code {code:?} in status {status}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_code_from_status() {
        let ok = serde_json::json!({"metadata": {}, "status": "Success"});
        assert_eq!(exit_code(&ok).unwrap(), 0);
        let failed = serde_json::json!({
            "status": "Failure",
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": "7"}]},
        });
        assert_eq!(exit_code(&failed).unwrap(), 7);
        let internal = serde_json::json!({"status": "Failure", "reason": "InternalError"});
        assert!(exit_code(&internal).is_err());
    }
}
