//! The logging setup every Warren binary shares: one line per event on
//! stderr, JSON by default (`plain` for people), filtered by `RUST_LOG`
//! (default `info`). In JSON each line carries the fields of the spans it
//! happened in — the gateway's `request_id`, the `trace_id`/`execution_id`
//! the node-agent records for the same call, the operator's reconciled
//! `object` — so one id finds a call's lines in every component.

pub mod otlp;

use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One JSON object per line, event fields at the top level.
    Json,
    /// Human-readable lines.
    Plain,
}

impl std::str::FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Format, String> {
        match s {
            "json" => Ok(Format::Json),
            "plain" => Ok(Format::Plain),
            other => Err(format!("log format {other:?}: expected json or plain")),
        }
    }
}

/// Installs the global subscriber. Call once, first thing in `main`; an
/// unknown format falls back to JSON (flags validate it before this).
pub fn init(format: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    subscriber(format.parse().unwrap_or(Format::Json), filter, std::io::stderr).init();
}

/// The subscriber [`init`] installs, writing to `writer`.
pub fn subscriber<W>(format: Format, filter: EnvFilter, writer: W) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer).with_span_events(FmtSpan::NONE);
    match format {
        Format::Json => Box::new(builder.json().flatten_event(true).with_current_span(false).with_span_list(true).finish()),
        Format::Plain => Box::new(builder.finish()),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn formats_parse_and_unknown_ones_are_refused() {
        assert_eq!("json".parse(), Ok(Format::Json));
        assert_eq!("plain".parse(), Ok(Format::Plain));
        assert!("xml".parse::<Format>().is_err());
    }

    #[test]
    fn json_lines_carry_the_ids_of_their_spans() {
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = subscriber(Format::Json, EnvFilter::new("info"), move || writer.clone());
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("execute", trace_id = "trc_1", execution_id = "trc_1");
            let _in = span.enter();
            tracing::info!(exit_code = 0, "execution finished");
        });
        let line = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert!(line.contains(r#""message":"execution finished""#) && line.contains(r#""exit_code":0"#), "{line}");
        assert!(line.contains(r#""trace_id":"trc_1""#) && line.contains(r#""name":"execute""#), "{line}");
    }
}
