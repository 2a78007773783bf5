//! The container's exit recorder, seen from the shim: one `agent-sandbox exit-recorder ID`
//! per container, started beside its first exec and kept while execs come, writes each
//! exec's audit `exit` record when the shim reports the exit (a JSON line each way over a
//! socket pair). An `audit-exit` run per exec cost a runtime start (about 4 ms here) before
//! every exec's TaskExit. Whenever the recorder cannot answer (ended after its idle time,
//! died, not started, too slow) the exit goes to `audit-exit` as before; the runtime keeps
//! one record per exec either way (docs/audit.md).

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::Mutex;

use crate::runtime::{Runtime, RuntimeError};

/// How long an exit waits for the recorder's answer before `audit-exit` writes it instead.
/// A record may wait up to 0.5 s for the seccomp supervisor's fence, then for a sync.
const ANSWER_LIMIT: Duration = Duration::from_secs(5);

/// Why the recorder wrote no record.
#[derive(Debug, thiserror::Error)]
pub enum RecorderError {
    #[error("cannot start the exit recorder")]
    Start(#[source] RuntimeError),
    #[error("cannot talk to the exit recorder")]
    Io(#[source] std::io::Error),
    #[error("the exit recorder did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the exit recorder could not write the record: {0}")]
    Refused(String),
    #[error("the exit recorder ended without answering once (an older runtime binary?)")]
    GivenUp,
}

impl RecorderError {
    /// Whether the record may still be written by `audit-exit`: the recorder never took it
    /// in hand, or may have but then a second report of the same exec writes nothing.
    pub fn unanswered(&self) -> bool {
        !matches!(self, Self::Refused(_))
    }
}

/// One container's recorder, if it runs.
#[derive(Default)]
pub struct ExitRecorder {
    conn: Mutex<Option<Conn>>,
    /// Set once a recorder ended without answering anything: the runtime binary cannot
    /// record (an older one, a sandbox it does not find), so every exit goes to `audit-exit`
    /// without starting another.
    given_up: AtomicBool,
}

impl std::fmt::Debug for ExitRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ExitRecorder")
    }
}

/// The shim's end of a running recorder, for container `id`.
struct Conn {
    id: String,
    stream: BufReader<UnixStream>,
    answered: bool,
}

impl Conn {
    fn start(runtime: &Runtime, id: &str) -> Result<Self, RecorderError> {
        let stream = runtime
            .spawn_exit_recorder(id)
            .map_err(RecorderError::Start)?;
        stream.set_nonblocking(true).map_err(RecorderError::Io)?;
        let stream = UnixStream::from_std(stream).map_err(RecorderError::Io)?;
        Ok(Self {
            id: id.to_owned(),
            stream: BufReader::new(stream),
            answered: false,
        })
    }

    /// Whether the recorder is still there: it has not closed its end (after its idle time)
    /// and has nothing unasked in flight.
    fn alive(&self) -> bool {
        let flags = rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT;
        let peek = rustix::net::recv(self.stream.get_ref().as_fd(), &mut [0u8; 1], flags);
        self.stream.buffer().is_empty() && matches!(peek, Err(rustix::io::Errno::AGAIN))
    }

    async fn ask(&mut self, line: &str) -> std::io::Result<String> {
        self.stream.get_mut().write_all(line.as_bytes()).await?;
        let mut answer = String::new();
        if self.stream.read_line(&mut answer).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(answer)
    }
}

/// The recorder's answer to one line.
#[derive(Deserialize)]
struct Answer {
    #[serde(default)]
    ok: bool,
    error: Option<String>,
}

impl ExitRecorder {
    /// Starts the container's recorder unless one runs: beside an exec's start, so that its
    /// own start is off the path of that exec's exit. A failure here is only logged: the
    /// exit then starts one or goes to `audit-exit`.
    pub async fn warm(&self, runtime: &Runtime, id: &str) {
        if self.given_up.load(Ordering::Relaxed) {
            return;
        }
        if let Err(e) = connected(&mut *self.conn.lock().await, runtime, id) {
            log::warn!("exit recorder of {id}: {e}");
        }
    }

    /// Has the recorder write the `exit` record of exec `exec_id` (`code` as the reaper
    /// folds it) and waits for it to be in the log.
    pub async fn record(
        &self,
        runtime: &Runtime,
        id: &str,
        exec_id: &str,
        pid: u32,
        code: u32,
    ) -> Result<(), RecorderError> {
        let line = serde_json::json!({ "process": exec_id, "pid": pid, "status": code });
        if self.given_up.load(Ordering::Relaxed) {
            return Err(RecorderError::GivenUp);
        }
        let mut guard = self.conn.lock().await;
        let conn = connected(&mut guard, runtime, id)?;
        let answer = match tokio::time::timeout(ANSWER_LIMIT, conn.ask(&format!("{line}\n"))).await
        {
            Ok(Ok(answer)) => {
                conn.answered = true;
                answer
            }
            Ok(Err(e)) => {
                if !conn.answered {
                    self.given_up.store(true, Ordering::Relaxed);
                }
                *guard = None;
                return Err(RecorderError::Io(e));
            }
            Err(_) => {
                // Its answer would come after the next question's: start afresh.
                *guard = None;
                return Err(RecorderError::Timeout(ANSWER_LIMIT));
            }
        };
        match serde_json::from_str::<Answer>(&answer) {
            Ok(Answer { ok: true, .. }) => Ok(()),
            Ok(Answer { error, .. }) => Err(RecorderError::Refused(
                error.unwrap_or_else(|| "no reason given".to_owned()),
            )),
            Err(e) => {
                *guard = None;
                Err(RecorderError::Io(std::io::Error::other(e)))
            }
        }
    }

    /// Ends the recorder, if one runs, and waits (up to [`ANSWER_LIMIT`]) until it is gone:
    /// before the container's delete, so that nothing of the sandbox outlives it.
    pub async fn close(&self) {
        let Some(mut conn) = self.conn.lock().await.take() else {
            return;
        };
        let _ = conn.stream.get_mut().shutdown().await;
        let mut rest = Vec::new();
        // Its end closes when it exits.
        let _ = tokio::time::timeout(ANSWER_LIMIT, conn.stream.read_to_end(&mut rest)).await;
    }
}

/// The running recorder of container `id`, started if there is none or the last one ended.
fn connected<'a>(
    conn: &'a mut Option<Conn>,
    runtime: &Runtime,
    id: &str,
) -> Result<&'a mut Conn, RecorderError> {
    let running = match conn.take() {
        Some(c) if c.id == id && c.alive() => c,
        _ => Conn::start(runtime, id)?,
    };
    Ok(conn.insert(running))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::RuntimeOptions;

    /// A runtime binary that is a shell script: `body` runs for `exit-recorder` (stdin and
    /// stdout the shim's socket), and every run's first word goes to `calls`.
    fn fake_runtime(dir: &std::path::Path, body: &str) -> Runtime {
        let bin = dir.join("runtime");
        let calls = dir.join("calls");
        crate::test_util::write_script(
            &bin,
            &format!(
                "#!/bin/sh\nshift 6\necho \"$1\" >>{}\n[ \"$1\" = exit-recorder ] || exit 0\n{body}\n",
                calls.display()
            ),
        );
        let opts = RuntimeOptions {
            runtime: bin,
            ..RuntimeOptions::defaults("default")
        };
        Runtime::new(&opts, dir)
    }

    fn calls(dir: &std::path::Path) -> Vec<String> {
        std::fs::read_to_string(dir.join("calls"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    #[tokio::test]
    async fn one_recorder_answers_every_exit_of_its_container() {
        let dir = tempfile::tempdir().unwrap();
        let body = "while read -r line; do echo \"$line\" >>\"$(dirname \"$0\")/asked\"; echo '{\"ok\":true}'; done";
        let runtime = fake_runtime(dir.path(), body);
        let recorder = ExitRecorder::default();
        recorder.warm(&runtime, "c1").await;
        for (exec, code) in [("e1", 0), ("e2", 137)] {
            recorder
                .record(&runtime, "c1", exec, 40, code)
                .await
                .unwrap();
        }
        recorder.close().await;
        assert_eq!(calls(dir.path()), ["exit-recorder"]);
        let asked = std::fs::read_to_string(dir.path().join("asked")).unwrap();
        assert_eq!(
            asked,
            "{\"pid\":40,\"process\":\"e1\",\"status\":0}\n{\"pid\":40,\"process\":\"e2\",\"status\":137}\n"
        );
    }

    #[tokio::test]
    async fn a_refusal_is_final_and_a_recorder_that_never_answers_is_given_up() {
        let dir = tempfile::tempdir().unwrap();
        let refusing = fake_runtime(
            dir.path(),
            "while read -r line; do echo '{\"error\":\"disk full\"}'; done",
        );
        let recorder = ExitRecorder::default();
        let refused = recorder.record(&refusing, "c1", "e1", 7, 0).await;
        assert!(
            matches!(&refused, Err(e @ RecorderError::Refused(m)) if m == "disk full" && !e.unanswered()),
            "{refused:?}"
        );
        let silent = fake_runtime(dir.path(), "exit 2");
        let recorder = ExitRecorder::default();
        let first = recorder.record(&silent, "c1", "e1", 7, 0).await;
        assert!(
            matches!(&first, Err(e @ RecorderError::Io(_)) if e.unanswered()),
            "{first:?}"
        );
        let second = recorder.record(&silent, "c1", "e2", 8, 0).await;
        assert!(matches!(second, Err(RecorderError::GivenUp)), "{second:?}");
        recorder.warm(&silent, "c1").await;
        assert_eq!(calls(dir.path()), ["exit-recorder", "exit-recorder"]);
    }
}
