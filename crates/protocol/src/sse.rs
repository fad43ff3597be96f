//! The one SSE reader: bytes in, [`SseFrame`]s out. A line is cut at LF, CRLF or CR (a CR
//! at the end of a chunk and the LF that starts the next are one line end), and is decoded
//! only once whole, so a character split across two chunks comes out whole. Owns reading
//! events off the wire (the service's streams, and a model server's); what an event means is
//! [`Frame`]'s.
//!
//! It scans each chunk once for line ends and copies each field once: model servers stream a
//! reply as one small event per token, so this is on every turn's path.

use crate::frame::{Frame, FrameError};
use futures::{Stream, StreamExt};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::str::Utf8Error;

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
    /// A line is not UTF-8.
    #[error("the event stream is not UTF-8: {0}")]
    Utf8(#[from] Utf8Error),
    /// A line or an event's data outgrew [`MAX_EVENT_BYTES`] (a server that never ends one).
    #[error("an event of the stream is larger than {MAX_EVENT_BYTES} bytes")]
    TooLarge,
}

/// Most bytes one line, or one event's data, may hold: far above any frame or model chunk
/// (a tool outcome is capped at 64 KiB), so only a broken or hostile server reaches it.
pub const MAX_EVENT_BYTES: usize = 8 * 1024 * 1024;

/// Reads events off bytes fed to it in pieces of any size.
#[derive(Debug, Default)]
pub struct SseParser {
    /// Bytes of a line not ended yet.
    line: Vec<u8>,
    /// The last chunk ended with a CR: an LF first in the next one ends nothing.
    after_cr: bool,
    /// The fields of the event being read.
    event: String,
    data: String,
    /// Whether a `data` field came (an event without one is not dispatched).
    has_data: bool,
    /// The last id the stream set (it carries over to later events).
    last_id: Option<String>,
}

impl SseParser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads `chunk`, appending the events it completes to `out`.
    ///
    /// # Errors
    /// [`SseError::Utf8`] for a line that is not UTF-8, [`SseError::TooLarge`] for a line or
    /// an event past [`MAX_EVENT_BYTES`] (the parser should not be fed on).
    pub fn feed(&mut self, mut chunk: &[u8], out: &mut VecDeque<SseFrame>) -> Result<(), SseError> {
        if std::mem::take(&mut self.after_cr) && chunk.first() == Some(&b'\n') {
            chunk = &chunk[1..];
        }
        while let Some(end) = memchr::memchr2(b'\n', b'\r', chunk) {
            let cr = chunk[end] == b'\r';
            if self.line.is_empty() {
                self.take_line(&chunk[..end], out)?;
            } else {
                self.line.extend_from_slice(&chunk[..end]);
                let line = std::mem::take(&mut self.line);
                self.take_line(&line, out)?;
                self.line = line;
                self.line.clear();
            }
            chunk = &chunk[end + 1..];
            if cr {
                match chunk.first() {
                    Some(b'\n') => chunk = &chunk[1..],
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
        }
        if self.line.len() + chunk.len() > MAX_EVENT_BYTES {
            return Err(SseError::TooLarge);
        }
        self.line.extend_from_slice(chunk);
        Ok(())
    }

    /// One whole line (without its end).
    fn take_line(&mut self, line: &[u8], out: &mut VecDeque<SseFrame>) -> Result<(), SseError> {
        if line.is_empty() {
            self.dispatch(out);
            return Ok(());
        }
        if line[0] == b':' {
            return Ok(());
        }
        let line = std::str::from_utf8(line)?;
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "data" => {
                if self.data.len() + value.len() >= MAX_EVENT_BYTES {
                    return Err(SseError::TooLarge);
                }
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => value.clone_into(&mut self.event),
            "id" if !value.contains('\0') => self.last_id = Some(value.to_owned()),
            // `retry`, and fields SSE does not define, are ignored.
            _ => {}
        }
        Ok(())
    }

    /// Ends the event being read: appended to `out` when it has data.
    fn dispatch(&mut self, out: &mut VecDeque<SseFrame>) {
        let event = std::mem::take(&mut self.event);
        if !std::mem::take(&mut self.has_data) {
            return;
        }
        out.push_back(SseFrame {
            id: self.last_id.clone().filter(|id| !id.is_empty()),
            event: if event.is_empty() { "message".to_owned() } else { event },
            data: std::mem::take(&mut self.data),
        });
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
    struct Reading<S> {
        bytes: std::pin::Pin<Box<S>>,
        parser: SseParser,
        ready: VecDeque<SseFrame>,
        /// What stopped the reading, given after the events read before it.
        failed: Option<SseError>,
        ended: bool,
    }
    let start = Reading {
        bytes: Box::pin(bytes),
        parser: SseParser::new(),
        ready: VecDeque::new(),
        failed: None,
        ended: false,
    };
    futures::stream::unfold(start, |mut r| async move {
        loop {
            if let Some(frame) = r.ready.pop_front() {
                return Some((Ok(frame), r));
            }
            if let Some(e) = r.failed.take() {
                return Some((Err(e), r));
            }
            if r.ended {
                return None;
            }
            match r.bytes.next().await {
                Some(Ok(chunk)) => r.failed = r.parser.feed(chunk.as_ref(), &mut r.ready).err(),
                Some(Err(e)) => r.failed = Some(SseError::Transport(e.into())),
                // An event the stream does not end with a blank line is not dispatched.
                None => r.ended = true,
            }
            r.ended |= r.failed.is_some();
        }
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
        assert_eq!(
            read[0].frame().unwrap(),
            Frame::Done { conversation_id: crate::ConversationId(1), message_id: crate::MessageId(2) }
        );
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

    #[test]
    fn a_crlf_cut_between_its_cr_and_lf_is_one_line_end_and_lone_crs_end_lines() {
        let body = b"event: token\r\ndata: {\"content\":\"a\"}\r\n\r\ndata:b\rdata\r\r";
        let expected = vec![event(None, "token", "{\"content\":\"a\"}"), event(None, "message", "b\n")];
        for cut in 1..body.len() {
            assert_eq!(read(&[&body[..cut], &body[cut..]]), expected, "cut at byte {cut}");
        }
    }

    #[test]
    fn a_line_that_is_not_utf8_ends_the_stream_after_the_events_before_it() {
        let body: &[u8] = b"data: one\n\ndata: \xff\xfe\n\ndata: three\n\n";
        let chunks = futures::stream::iter([Ok::<_, Infallible>(body.to_vec())]);
        let read: Vec<_> = futures::executor::block_on(frames(chunks).collect());
        assert_eq!(read.len(), 2, "{read:?}");
        assert_eq!(read[0].as_ref().unwrap().data, "one");
        assert!(matches!(read[1], Err(SseError::Utf8(_))), "{read:?}");
    }

    #[test]
    fn a_server_that_never_ends_a_line_or_an_event_is_cut_off() {
        // One endless line, sent in 64 KiB pieces: the reader stops, holding at most the limit.
        let piece = vec![b'x'; 64 * 1024];
        let endless = futures::stream::iter(std::iter::repeat_n(piece.clone(), MAX_EVENT_BYTES / piece.len() + 2))
            .map(Ok::<_, Infallible>);
        let read: Vec<_> = futures::executor::block_on(frames(endless).collect());
        assert!(matches!(read.as_slice(), [Err(SseError::TooLarge)]), "{read:?}");
        // Endless `data:` lines of one event.
        let line = format!("data: {}\n", "y".repeat(1024 * 1024));
        let event = std::iter::repeat_n(line.into_bytes(), 10).map(Ok::<_, Infallible>);
        let read: Vec<_> = futures::executor::block_on(frames(futures::stream::iter(event)).collect());
        assert!(matches!(read.as_slice(), [Err(SseError::TooLarge)]), "{read:?}");
        // Just under the limit is read.
        let data = "z".repeat(MAX_EVENT_BYTES - 16);
        let body = format!("data: {data}\n\n");
        assert_eq!(parse_body(&body).first().map(|f| f.data.len()), Some(data.len()));
    }
}
