//! The agent graph runtime.
//!
//! Owns: typed graph state whose fields are channels with reducers ([`State`]); graphs of
//! async nodes with plain and conditional edges, validated when compiled ([`StateGraph`]);
//! running them with a recursion limit, a cancellation token and an event stream
//! ([`CompiledGraph`], [`RunEvent`]); pausing for human approval with any number of
//! interrupts per step and resuming *after* the pause point ([`Decision`]); and incremental
//! checkpoints behind one trait ([`Checkpointer`]: in memory, SQLite, PostgreSQL) with
//! history, replay and forks.
//!
//! Does not own: what a node does (models, tools and the prebuilt ReAct agent live in the
//! agents crate, above this one) or HTTP (the server crate). The runtime is generic over the
//! state and the dependencies nodes get, so it depends on no model or tool crate.
//!
//! Why LangGraph's known problems cannot happen here:
//! - each interrupt has its own id and resume takes a map id → decision, so decisions can
//!   never be routed to the wrong call;
//! - a pausing node hands its finished work to the runtime with the pause, and resume
//!   continues at the node named for that purpose: nothing before the pause runs twice;
//! - a checkpoint stores only what a step changed (the node's update), so storage grows with
//!   the number of steps, not with steps × state size;
//! - a failing tool is an outcome, never an error of the run.
#![warn(missing_docs)]

pub mod checkpoint;
mod error;
mod event;
mod graph;
mod heads;
mod interrupt;
pub mod migrations;
mod node;
pub mod pg;
mod runner;
mod shape;
pub mod sqlite;
mod state;

pub use checkpoint::{
    CheckpointError, CheckpointMeta, CheckpointRecord, Checkpointer, DerivedRows, EncodedRecord, MemoryCheckpointer,
    PostgresCheckpointer, RecordKind, RecordedRun, RunEnd, SqliteCheckpointer, ThreadId, recorded_runs,
};
pub use error::{GraphBuildError, GraphError, NodeError};
pub use event::{RunEvent, TokenUsage};
pub use graph::{CompiledGraph, StateGraph, StopCause};
pub use heads::ThreadState;
pub use interrupt::{Decision, InterruptId, InterruptRequest, PendingInterrupt};
pub use node::{END, Node, NodeOutput, RunContext, START};
pub use pg::{PgDatabase, PgPooling, PgSession};
pub use runner::{INTERRUPTED, ResumeResult, RunHandle, RunOptions, RunOutcome};
pub use shape::{EdgeKind, GraphShape, ShapeEdge};
pub use sqlite::{SqliteDatabase, SqliteError};
pub use state::State;
