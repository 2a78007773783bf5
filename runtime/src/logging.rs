//! Log output the way runc writes it, because podman and conmon read it:
//! `--log FILE` with `--log-format json` gives one logrus-style object per line
//! (`{"level":"error","msg":"...","time":"..."}`); text format is
//! `time="..." level=error msg="..."`. Without `--log`, only errors (and, with `--debug`,
//! everything) go to stderr: the runtime's stderr is often the container's own (a caller
//! that passes none hands its stream to the workload), so warnings go to the log or nowhere
//! (docs/contracts.md).

use std::fmt::Write as _;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::sync::{Mutex, OnceLock};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;

/// The two formats runc knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    #[error("cannot open log file {path}")]
    Open {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

struct LogrusLayer {
    out: Mutex<Box<dyn Write + Send>>,
    format: LogFormat,
    max: Level,
}

#[derive(Default)]
struct Collect {
    msg: String,
    fields: Vec<(String, String)>,
}

impl Visit for Collect {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.msg, "{value:?}");
        } else {
            self.fields
                .push((field.name().to_owned(), format!("{value:?}")));
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.msg.push_str(value);
        } else {
            self.fields
                .push((field.name().to_owned(), value.to_owned()));
        }
    }
}

fn level_name(level: &Level) -> &'static str {
    match *level {
        Level::ERROR => "error",
        Level::WARN => "warning",
        Level::INFO => "info",
        Level::DEBUG => "debug",
        Level::TRACE => "trace",
    }
}

/// Formats one line; public for the error path in `main`.
pub fn format_line(
    format: LogFormat,
    level: &Level,
    msg: &str,
    fields: &[(String, String)],
) -> String {
    let time = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true);
    match format {
        LogFormat::Json => {
            let mut obj = serde_json::Map::new();
            obj.insert("level".into(), level_name(level).into());
            obj.insert("msg".into(), msg.into());
            obj.insert("time".into(), time.into());
            for (k, v) in fields {
                obj.insert(k.clone(), v.clone().into());
            }
            serde_json::Value::Object(obj).to_string()
        }
        LogFormat::Text => {
            let mut line = format!("time={time:?} level={} msg={msg:?}", level_name(level));
            for (k, v) in fields {
                let _ = write!(line, " {k}={v:?}");
            }
            line
        }
    }
}

impl<S: Subscriber> Layer<S> for LogrusLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let level = event.metadata().level();
        if *level > self.max {
            return;
        }
        let mut c = Collect::default();
        event.record(&mut c);
        let line = format_line(self.format, level, &c.msg, &c.fields);
        if let Ok(mut out) = self.out.lock() {
            let _ = writeln!(out, "{line}");
        }
    }
}

/// The `--log FILE --log-format F` the runtime was given, for sidecars that log where it does.
static LOG_ARGS: OnceLock<Vec<std::ffi::OsString>> = OnceLock::new();

/// The runtime's own `--log` and `--log-format` arguments (none without `--log`).
pub fn log_args() -> &'static [std::ffi::OsString] {
    LOG_ARGS.get().map_or(&[], Vec::as_slice)
}

/// Installs the global subscriber. `debug` lowers the level to debug.
pub fn init(log: Option<&Path>, format: LogFormat, debug: bool) -> Result<(), LoggingError> {
    if let Some(path) = log {
        let format = match format {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        };
        let _ = LOG_ARGS.set(vec![
            "--log".into(),
            path.as_os_str().to_owned(),
            "--log-format".into(),
            format.into(),
        ]);
    }
    let out: Box<dyn Write + Send> = match log {
        Some(path) => Box::new(
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|source| LoggingError::Open {
                    path: path.to_owned(),
                    source,
                })?,
        ),
        None => Box::new(std::io::stderr()),
    };
    let max = max_level(
        log.is_some(),
        debug || std::env::var_os("AGENT_SANDBOX_DEBUG").is_some(),
    );
    let layer = LogrusLayer {
        out: Mutex::new(out),
        format,
        max,
    };
    // Only our own crates log at debug; libcontainer is chatty.
    let filter = tracing_subscriber::filter::Targets::new()
        .with_target("agent_sandbox", max)
        .with_default(if debug { Level::DEBUG } else { Level::ERROR });
    let _ = tracing_subscriber::registry()
        .with(layer.with_filter(filter))
        .try_init();
    Ok(())
}

/// The most verbose level written: debug when asked for; warnings only into a log file.
fn max_level(to_file: bool, debug: bool) -> Level {
    match (debug, to_file) {
        (true, _) => Level::DEBUG,
        (false, true) => Level::WARN,
        (false, false) => Level::ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_reach_a_log_file_never_stderr() {
        assert_eq!(max_level(true, false), Level::WARN);
        assert_eq!(max_level(false, false), Level::ERROR);
        assert_eq!(max_level(false, true), Level::DEBUG);
    }

    #[test]
    fn json_lines_look_like_logrus() {
        let line = format_line(
            LogFormat::Json,
            &Level::ERROR,
            "container \"x\" does not exist",
            &[],
        );
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["level"], "error");
        assert_eq!(v["msg"], "container \"x\" does not exist");
        assert!(v["time"].as_str().unwrap().contains('T'));
    }
}
