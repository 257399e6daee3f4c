//! The human format: `TIME LEVEL [weir] message fields…`, one line per event.
//!
//! weir's messages are written to stand alone (they name the job, checkpoint, operator…);
//! their structured fields repeat those values for machines. The line therefore shows only
//! the fields whose value the message does not already contain. Spans are left out: their
//! fields are in the JSON format.

use std::fmt::{self, Write};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The human line format (see the module documentation).
pub(super) struct Human;

impl<S, N> FormatEvent<S, N> for Human
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        SystemTime.format_time(&mut w)?;
        let meta = event.metadata();
        write!(w, " {:>5} [{}] ", meta.level(), tag(meta.target()))?;
        let mut fields = Fields::default();
        event.record(&mut fields);
        w.write_str(&line(&fields.message, &fields.others))?;
        writeln!(w)
    }
}

/// `weir` for weir's own crates, the target itself for others (`librdkafka`, `hyper`…).
fn tag(target: &str) -> &str {
    let krate = target.split("::").next().unwrap_or(target);
    if krate == "weir" || krate.starts_with("weir_") {
        "weir"
    } else {
        target
    }
}

/// The message, then ` name=value` for each field whose value it does not show.
fn line(message: &str, others: &[(&'static str, String)]) -> String {
    let mut out = message.to_string();
    for (name, value) in others {
        if value.is_empty() || !message.contains(value.as_str()) {
            let _ = if value.is_empty() || value.contains(char::is_whitespace) {
                write!(out, " {name}={value:?}")
            } else {
                write!(out, " {name}={value}")
            };
        }
    }
    out.trim_start().to_string()
}

/// An event's message and its other fields, as text.
#[derive(Default)]
struct Fields {
    message: String,
    others: Vec<(&'static str, String)>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else {
            self.others.push((field.name(), value.to_string()));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            self.others.push((field.name(), format!("{value:?}")));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weir_crates_are_tagged_weir() {
        assert_eq!(tag("weir_runtime::job"), "weir");
        assert_eq!(tag("weir"), "weir");
        assert_eq!(tag("weir_kafka::sink::recovery"), "weir");
        assert_eq!(tag("librdkafka"), "librdkafka");
        assert_eq!(tag("weird::thing"), "weird::thing");
    }

    #[test]
    fn fields_the_message_shows_are_left_out() {
        let others = vec![
            ("job", "file_sum".to_string()),
            ("checkpoint", "3".to_string()),
            ("error", "disk full".to_string()),
            ("bytes", "1234".to_string()),
        ];
        assert_eq!(
            line("job 'file_sum': checkpoint 3 failed", &others),
            "job 'file_sum': checkpoint 3 failed error=\"disk full\" bytes=1234"
        );
        assert_eq!(line("", &others[1..2]), "checkpoint=3");
    }
}
