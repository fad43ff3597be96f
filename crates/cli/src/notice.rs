//! What the binary says on stderr outside the `tracing` log — `serve`'s start-up and shutdown
//! lines, a command's final error — in the log's format: plain lines for people, or with
//! `--log-format json` one JSON object per line shaped like the log's (`timestamp`, `level`,
//! `fields.message`, `target`), so a log collector reads every line of stderr.

use std::sync::atomic::{AtomicBool, Ordering};

static JSON: AtomicBool = AtomicBool::new(false);

/// Whether notices are written as JSON (set once, from `--log-format`, before any is written).
pub fn set_json(json: bool) {
    JSON.store(json, Ordering::Relaxed);
}

/// `serve`'s notice (`toolgraph serve: listening on …` as text).
pub fn serve(message: impl std::fmt::Display) {
    write("INFO", "toolgraph serve: ", &message.to_string());
}

/// A warning before the log is set up (`warning: …` as text).
pub fn warning(message: impl std::fmt::Display) {
    write("WARN", "warning: ", &message.to_string());
}

/// A command's final error (`error: …` as text).
pub fn error(message: impl std::fmt::Display) {
    write("ERROR", "error: ", &message.to_string());
}

fn write(level: &str, text_prefix: &str, message: &str) {
    eprintln!("{}", line(JSON.load(Ordering::Relaxed), level, text_prefix, message));
}

fn line(json: bool, level: &str, text_prefix: &str, message: &str) -> String {
    if !json {
        return format!("{text_prefix}{message}");
    }
    use tracing_subscriber::fmt::time::FormatTime;
    let mut timestamp = String::new();
    // The log's own clock and format (RFC 3339, UTC); writing to a String cannot fail.
    let _ = tracing_subscriber::fmt::time::SystemTime
        .format_time(&mut tracing_subscriber::fmt::format::Writer::new(&mut timestamp));
    serde_json::json!({
        "timestamp": timestamp,
        "level": level,
        "fields": {"message": message},
        "target": "toolgraph",
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::line;

    #[test]
    fn a_notice_is_a_plain_line_or_one_json_object_like_the_logs() {
        assert_eq!(line(false, "INFO", "toolgraph serve: ", "listening"), "toolgraph serve: listening");
        let json: serde_json::Value =
            serde_json::from_str(&line(true, "ERROR", "error: ", "no \"port\"\nat all")).unwrap();
        assert_eq!(json["level"], "ERROR");
        assert_eq!(json["fields"]["message"], "no \"port\"\nat all");
        assert!(json["timestamp"].as_str().unwrap().ends_with('Z'), "{json}");
    }
}
