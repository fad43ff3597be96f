//! The one SSE reader: bytes in, [`SseFrame`]s out, on `eventsource-stream` (which keeps a
//! character split across two chunks whole, and takes LF, CRLF or CR line ends).
//! Owns reading events off the wire; what an event means is [`Frame`]'s.

use crate::frame::{Frame, FrameError};
use eventsource_stream::{EventStreamError, Eventsource};
use futures::{Stream, StreamExt};
use std::convert::Infallible;
use std::string::FromUtf8Error;

/// One event as it came off the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseFrame {
    /// Its id, or (as the EventSource spec has it) the last id before it; `None` when the
    /// stream has sent none. A run's frames are `<runId>:<seq>`.
    pub id: Option<String>,
    /// Its event name (`message` when it has none).
    pub event: String,
    /// Its data, the lines of a multi-line `data` joined with `\n`.
    pub data: String,
}

impl SseFrame {
    /// The typed frame this event carries.
    ///
    /// # Errors
    /// As [`Frame::parse`]: an unknown event name, or data that is not its JSON.
    pub fn frame(&self) -> Result<Frame, FrameError> {
        Frame::parse(&self.event, &self.data)
    }
}

/// Why a stream could not be read on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SseError {
    /// The bytes stopped coming (the connection broke, a read timed out, …).
    #[error("the event stream broke off: {0}")]
    Transport(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The bytes are not UTF-8.
    #[error("the event stream is not UTF-8: {0}")]
    Utf8(#[from] FromUtf8Error),
    /// A line is not SSE.
    #[error("the event stream is malformed: {detail}")]
    Malformed {
        /// Where the parser stopped.
        detail: String,
    },
}

impl<E: Into<Box<dyn std::error::Error + Send + Sync>>> From<EventStreamError<E>> for SseError {
    fn from(e: EventStreamError<E>) -> Self {
        match e {
            EventStreamError::Transport(e) => Self::Transport(e.into()),
            EventStreamError::Utf8(e) => Self::Utf8(e),
            EventStreamError::Parser(e) => Self::Malformed { detail: e.to_string() },
        }
    }
}

/// The events of a byte stream (an HTTP body: `reqwest::Response::bytes_stream()`), in order.
/// Comments (keep-alives) and events without data are skipped, as an EventSource does. The
/// stream ends after its first error: nothing after a broken or malformed stretch is read.
pub fn frames<S, B, E>(bytes: S) -> impl Stream<Item = Result<SseFrame, SseError>>
where
    S: Stream<Item = Result<B, E>>,
    B: AsRef<[u8]>,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut failed = false;
    bytes
        .eventsource()
        .map(|read| {
            read.map(|e| SseFrame { id: (!e.id.is_empty()).then_some(e.id), event: e.event, data: e.data })
                .map_err(SseError::from)
        })
        .take_while(move |read| {
            let go = !failed;
            failed |= read.is_err();
            std::future::ready(go)
        })
}

/// The events of a whole SSE body, through the same reader as [`frames`] (for tests that hold
/// a response's text). An event the body does not end (no blank line after it) is left out.
pub fn parse_body(text: &str) -> Vec<SseFrame> {
    let body = futures::stream::iter([Ok::<_, Infallible>(text.as_bytes())]);
    // Text is UTF-8 and every line of it is a field, a comment or blank: nothing fails.
    futures::executor::block_on(frames(body).filter_map(|read| std::future::ready(read.ok())).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The events of `chunks`, read as separate pieces of a body.
    fn read(chunks: &[&[u8]]) -> Vec<SseFrame> {
        let body = futures::stream::iter(chunks.iter().map(|c| Ok::<_, Infallible>(c.to_vec())));
        futures::executor::block_on(frames(body).map(Result::unwrap).collect())
    }

    fn event(id: Option<&str>, event: &str, data: &str) -> SseFrame {
        SseFrame { id: id.map(str::to_owned), event: event.into(), data: data.into() }
    }

    #[test]
    fn a_character_split_across_chunks_comes_out_whole() {
        let content = "café ệ 🎉";
        let body = format!("id: r:1\nevent: token\ndata: {{\"content\":\"{content}\"}}\n\n");
        let bytes = body.as_bytes();
        let expected = vec![event(Some("r:1"), "token", &format!("{{\"content\":\"{content}\"}}"))];
        // Every cut, those inside `é` (2 bytes), `ệ` (3) and `🎉` (4) included.
        for cut in 1..bytes.len() {
            let read = read(&[&bytes[..cut], &bytes[cut..]]);
            assert_eq!(read, expected, "cut at byte {cut}");
            assert_eq!(read[0].frame().unwrap(), Frame::Token { content: content.into() });
        }
        // One byte at a time.
        let bytewise: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(read(&bytewise), expected);
    }

    #[test]
    fn crlf_line_ends_are_read() {
        let body = b"id: r:1\r\nevent: done\r\ndata: {\"conversationId\":1,\"messageId\":2}\r\n\r\n";
        let read = read(&[&body[..20], &body[20..]]);
        assert_eq!(read[0].frame().unwrap(), Frame::Done { conversation_id: 1, message_id: 2 });
        assert_eq!(read[0].id.as_deref(), Some("r:1"));
    }

    #[test]
    fn comments_and_keep_alives_are_skipped() {
        let body = ":\n\n: keep-alive\n\nevent: token\n: a comment inside\ndata: {\"content\":\"a\"}\n\n:\n\n";
        assert_eq!(read(&[body.as_bytes()]), vec![event(None, "token", "{\"content\":\"a\"}")]);
    }

    #[test]
    fn a_body_reads_whole_with_its_ids() {
        let body = "id: r:1\nevent: token\ndata: {\"content\":\"a\"}\n\nevent: custom\ndata: line 1\ndata: line 2\n\n\
                    data: no name\n\nevent: cut\ndata: {}";
        assert_eq!(
            parse_body(body),
            vec![
                event(Some("r:1"), "token", "{\"content\":\"a\"}"),
                event(Some("r:1"), "custom", "line 1\nline 2"),
                event(Some("r:1"), "message", "no name"),
            ]
        );
    }

    #[test]
    fn a_broken_transport_ends_the_stream_with_its_error() {
        let chunks: Vec<Result<&[u8], std::io::Error>> = vec![
            Ok(b"event: token\ndata: {\"content\":\"a\"}\n\n"),
            Err(std::io::Error::other("reset")),
            Ok(b"event: done\ndata: {}\n\n"),
        ];
        let read: Vec<_> = futures::executor::block_on(frames(futures::stream::iter(chunks)).collect());
        assert_eq!(read.len(), 2);
        assert!(read[0].is_ok());
        assert!(matches!(&read[1], Err(SseError::Transport(e)) if e.to_string() == "reset"));
    }
}
