//! Server-Sent Events as the bytes they go out as, and the response that streams them.
//!
//! Every door streams its events through here: each event is written once into a buffer of
//! its size. (axum's `sse::Event` grew its buffer field by field and line by line, and asserts
//! — panics — on a line break in an event's name or id: 8 % of a streamed run's
//! instructions went to building events; docs/benchmarks.md, "LangGraph's Agent Server API".)
//! A stream that sends nothing for [`KEEP_ALIVE`] sends a comment, so proxies and clients keep
//! the connection.

use axum::body::{Body, Bytes};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

/// How long a stream stays silent before a keep-alive comment.
pub(crate) const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The comment a silent stream sends.
const COMMENT: &[u8] = b":\n\n";

/// One event, encoded: `event:` (when named), `id:` (when given), its data as `data:` lines,
/// and the blank line that ends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SseEvent(Bytes);

impl SseEvent {
    /// An unnamed event (a client reads it as `message`) carrying `data`.
    pub(crate) fn data(data: &str) -> Self {
        Self::new(None, None, data)
    }

    /// An event with each field given. A line break in `name` or `id` would end its field
    /// early: it is sent as a space. Each line of `data` is a `data:` field of its own (a
    /// client joins them with line breaks again).
    pub(crate) fn new(name: Option<&str>, id: Option<&str>, data: &str) -> Self {
        let fields = name.map_or(0, |n| n.len() + 8) + id.map_or(0, |i| i.len() + 5);
        let mut out = Vec::with_capacity(fields + data.len() + 8);
        if let Some(name) = name {
            field(&mut out, b"event", name);
        }
        if let Some(id) = id {
            field(&mut out, b"id", id);
        }
        let mut rest = data.as_bytes();
        loop {
            let end = memchr::memchr2(b'\n', b'\r', rest);
            out.extend_from_slice(b"data: ");
            out.extend_from_slice(&rest[..end.unwrap_or(rest.len())]);
            out.push(b'\n');
            let Some(end) = end else { break };
            // `\r\n` is one line break, as `\r` and `\n` alone are.
            let skip = if rest[end..].starts_with(b"\r\n") { 2 } else { 1 };
            rest = &rest[end + skip..];
        }
        out.push(b'\n');
        Self(Bytes::from(out))
    }

    /// The event as it is sent.
    #[cfg(test)]
    fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// Field `name` with `value` on one line.
fn field(out: &mut Vec<u8>, name: &[u8], value: &str) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    if memchr::memchr2(b'\n', b'\r', value.as_bytes()).is_some() {
        out.extend(value.bytes().map(|b| if b == b'\n' || b == b'\r' { b' ' } else { b }));
    } else {
        out.extend_from_slice(value.as_bytes());
    }
    out.push(b'\n');
}

/// The response that streams `events` (`text/event-stream`, not cached), a keep-alive comment
/// after each [`KEEP_ALIVE`] of silence.
pub(crate) fn response<S>(events: S) -> Response
where
    S: Stream<Item = SseEvent> + Send + 'static,
{
    let body = KeptAlive::new(events, KEEP_ALIVE);
    ([(CONTENT_TYPE, "text/event-stream"), (CACHE_CONTROL, "no-cache")], Body::from_stream(body)).into_response()
}

/// `events` as a body's bytes, with a comment whenever they are silent for `every`.
struct KeptAlive<S> {
    events: Pin<Box<S>>,
    every: Duration,
    idle: Pin<Box<Sleep>>,
}

impl<S> KeptAlive<S> {
    fn new(events: S, every: Duration) -> Self {
        Self { events: Box::pin(events), every, idle: Box::pin(tokio::time::sleep(every)) }
    }
}

impl<S: Stream<Item = SseEvent>> Stream for KeptAlive<S> {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        match this.events.as_mut().poll_next(cx) {
            Poll::Ready(Some(event)) => {
                this.idle.as_mut().reset(Instant::now() + this.every);
                Poll::Ready(Some(Ok(event.0)))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match this.idle.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.idle.as_mut().reset(Instant::now() + this.every);
                    Poll::Ready(Some(Ok(Bytes::from_static(COMMENT))))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    #[test]
    fn an_event_is_its_fields_then_its_data_lines_then_a_blank_line() {
        let event = SseEvent::new(Some("messages"), Some("7"), r#"[{"content":"hi\nthere"}]"#);
        assert_eq!(event.bytes(), b"event: messages\nid: 7\ndata: [{\"content\":\"hi\\nthere\"}]\n\n");
        assert_eq!(SseEvent::data("{}").bytes(), b"data: {}\n\n");
        assert_eq!(SseEvent::new(Some("end"), None, "").bytes(), b"event: end\ndata: \n\n", "empty data is still data");
    }

    #[test]
    fn line_breaks_split_data_and_never_end_a_field_early() {
        let event = SseEvent::new(Some("a\nb"), Some("1\r\n2"), "one\ntwo\r\nthree\rfour\n");
        assert_eq!(
            event.bytes(),
            b"event: a b\nid: 1  2\ndata: one\ndata: two\ndata: three\ndata: four\ndata: \n\n".as_slice()
        );
    }

    #[tokio::test]
    async fn a_silent_stream_sends_a_comment_and_events_go_out_as_they_come() {
        let every = Duration::from_millis(100);
        let (tx, rx) = tokio::sync::mpsc::channel::<SseEvent>(4);
        let mut body = KeptAlive::new(tokio_stream_of(rx), every);
        tx.send(SseEvent::data("1")).await.unwrap();
        // Before the event goes out, which starts the silence.
        let started = Instant::now();
        assert_eq!(body.next().await.unwrap().unwrap(), Bytes::from_static(b"data: 1\n\n"));
        // Nothing for a while: a comment, once per silence.
        assert_eq!(body.next().await.unwrap().unwrap(), Bytes::from_static(COMMENT));
        assert!(started.elapsed() >= every);
        tx.send(SseEvent::data("2")).await.unwrap();
        assert_eq!(body.next().await.unwrap().unwrap(), Bytes::from_static(b"data: 2\n\n"));
        drop(tx);
        assert!(body.next().await.is_none(), "the body ends with its events");
    }

    fn tokio_stream_of(mut rx: tokio::sync::mpsc::Receiver<SseEvent>) -> impl Stream<Item = SseEvent> {
        futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }
}
