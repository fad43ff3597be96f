//! The [`ChatModel`] trait every model backend implements.

use crate::error::LlmError;
use crate::types::{ChatEvent, ChatRequest, ChatResponse, FinishReason};
use async_trait::async_trait;
use futures::{Stream, StreamExt};
use std::pin::Pin;

/// A streamed reply. Ends after [`ChatEvent::Finished`] or the first error.
pub type ChatStream = Pin<Box<dyn Stream<Item = Result<ChatEvent, LlmError>> + Send>>;

/// A chat model that streams its replies.
///
/// Contract: a stream yields text and tool-call deltas as they arrive, then every complete
/// tool call once, then usage if known, then one `Finished`; after an `Err` it yields nothing
/// more. Retrying is the implementation's business and happens only before the first event
/// reached the caller, so a caller never sees a reply twice.
#[async_trait]
pub trait ChatModel: Send + Sync {
    /// Starts a reply.
    async fn stream(&self, request: ChatRequest) -> Result<ChatStream, LlmError>;

    /// A whole reply. The default collects [`ChatModel::stream`]; clients with a cheaper
    /// non-streaming call override it.
    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, LlmError> {
        collect_response(self.stream(request).await?).await
    }

    /// Computes `request`'s prompt ahead of the turns that will start with it, so a model that
    /// keeps computed prompt state (a server with a prefix cache, the in-process model) answers
    /// them sooner. The default asks for one token and drops it; the in-process model computes
    /// the prompt without generating and keeps it on disk.
    ///
    /// # Errors
    /// As [`ChatModel::stream`].
    async fn prepare(&self, mut request: ChatRequest) -> Result<(), LlmError> {
        request.max_tokens = Some(1);
        let mut stream = self.stream(request).await?;
        while let Some(event) = stream.next().await {
            event?;
        }
        Ok(())
    }

    /// How likely the model finds the end of `request`'s last message: the natural
    /// log-probability of each token of `tail` (the text that message ends with), given the
    /// prompt before it. `Ok(None)` when the model cannot tell — the default, as an
    /// OpenAI-compatible server's chat API does not report a prompt's probabilities; callers then
    /// go without what they would have judged by it. A grounded agent asks it how much more
    /// likely the person's question is after the documents it found than without them
    /// (docs/retrieval.md, "Grounded answers").
    ///
    /// # Errors
    /// As [`ChatModel::stream`]; a `tail` the last message does not end with is
    /// [`LlmError::InvalidRequest`]. A tail or prompt too long to score is `Ok(None)`.
    async fn tail_logprobs(&self, request: ChatRequest, tail: &str) -> Result<Option<Vec<f32>>, LlmError> {
        let _ = (request, tail);
        Ok(None)
    }

    /// The model's identifier, for logs and metrics.
    fn model_id(&self) -> &str;
}

/// Drains a stream into a [`ChatResponse`].
///
/// # Errors
/// The stream's first error, or [`LlmError::Incomplete`] if it ended without `Finished`.
pub async fn collect_response(mut stream: ChatStream) -> Result<ChatResponse, LlmError> {
    let mut content = String::new();
    let mut tool_calls = Vec::new();
    let mut usage = None;
    let mut finish: Option<FinishReason> = None;
    while let Some(event) = stream.next().await {
        match event? {
            ChatEvent::TextDelta(t) => content.push_str(&t),
            ChatEvent::ToolCallDelta { .. } => {}
            ChatEvent::ToolCall(c) => tool_calls.push(c),
            ChatEvent::Usage(u) => usage = Some(u),
            ChatEvent::Finished(r) => finish = Some(r),
        }
    }
    let finish_reason = finish.ok_or(LlmError::Incomplete)?;
    Ok(ChatResponse { content, tool_calls, finish_reason, usage })
}
