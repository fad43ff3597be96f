//! The stream protocol of a toolgraph chat run: what a run's SSE stream carries, typed, and the
//! one reader of such streams.
//!
//! Owns: [`Frame`], every kind of frame a run streams, with its event name and its JSON data
//! exactly as the wire has them (`frame`); [`sse::frames`], the one SSE reader, which every
//! client in the workspace uses — the `chat --url` client, `bench streams` and the tests
//! (`sse`); the ids of the contract as types (`ids`).
//!
//! Does not own: running a turn or storing its frames (`toolgraph-server` writes them,
//! `toolgraph-conversations` keeps them for replicas), nor the request and confirm bodies of the
//! chat contract (`toolgraph-server`'s `wire`). It depends on no other toolgraph crate, so a
//! client reads a stream without compiling the service.
//!
//! # Example
//!
//! ```
//! use toolgraph_protocol::{Frame, sse};
//!
//! let frame = Frame::Token { content: "Hola".into() };
//! let body = format!("event: {}\ndata: {}\n\n", frame.event(), frame.data());
//! assert_eq!(body, "event: token\ndata: {\"content\":\"Hola\"}\n\n");
//!
//! let read = sse::parse_body(&body);
//! assert_eq!(read[0].frame().unwrap(), frame);
//! assert!(!frame.is_terminal());
//! ```
#![warn(missing_docs)]
#![doc(test(attr(deny(warnings))))]

pub mod frame;
pub mod ids;
pub mod sse;

pub use frame::{EVENTS, Frame, FrameError, PendingAction, is_terminal_event};
pub use ids::{ConversationId, MessageId, RunId, TenantId, UserId};
pub use sse::{SseError, SseFrame};
