//! [`ChatService`]: the chat contract without HTTP — start a turn, decide pending actions,
//! replay a run, delete a conversation's, user's or tenant's data. The routes parse a request,
//! call one method and turn its result (or [`ChatError`]) into an answer.
//!
//! A turn is a detached run: it is claimed in the store (one run per conversation, held by the
//! database), started on the agent's graph, and driven on the service's task tracker, logging
//! its frames for every reader; the request only subscribes to that log.

use crate::auth::{AdmittedTenant, Principal};
use crate::error::ChatError;
use crate::metrics::Metrics;
use crate::runlog::{RunLog, RunLogs};
use crate::shared_runs::SharedRuns;
use turn::Turn;

mod attachments;
mod items;
mod retention;
mod turn;
mod usage;
use crate::wire::{ConfirmResponse, MAX_LISTED_CONVERSATIONS, PendingActionDto};
pub use attachments::{
    AttachedDocument, Attachments, DocumentList, MAX_ATTACHED_PER_TURN, MAX_UPLOAD_BYTES, UploadReceipt,
};
use futures::StreamExt;
pub use retention::{Pruned, Retention};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use toolgraph_agents::chat_agent::{ChatAgent, QUESTION, Resumed, Revision, TurnInput, check_answer};
use toolgraph_config::AgentSettings;
use toolgraph_conversations::{
    ConversationStore, ConversationThread, Decided, PendingLookup, ReleasedTurn, Role, RunEventStore, RunScope,
    TurnClaim,
};
use toolgraph_graph::{CheckpointMeta, Checkpointer, Decision, GraphError, InterruptId, RecordKind, RunOptions};
use toolgraph_protocol::{ConversationId, MessageId, RunId};
pub use usage::{BudgetPeriod, BudgetStatus, TokenBudget};

/// A turn a door asks for, in the service's terms; who asks is the [`Principal`] beside it.
#[derive(Debug, Clone, Default)]
pub struct NewTurn {
    /// The tenant's slug: what tools such as `rag_search` scope their reads by.
    pub tenant_slug: String,
    /// The conversation it continues; a new one when `None`.
    pub conversation: Option<ConversationId>,
    /// The person's message.
    pub message: String,
    /// The agent to talk to (else the conversation's, else the default one).
    pub agent: Option<String>,
    /// State values for injected tool arguments.
    pub context: Option<Map<String, Value>>,
    /// Whether the run's stream carries its tool calls and results too.
    pub tool_events: bool,
    /// Whether the run's stream also carries its nodes' starts and ends and the data they
    /// stream of their own (`node_started`, `node_finished`, `custom`): what LangGraph's
    /// `debug`, `tasks`, `checkpoints` and `custom` stream modes are written from.
    pub node_events: bool,
    /// The person's uploads this turn attaches to the conversation (docs/service.md,
    /// "Documents in the conversation").
    pub attachments: Vec<String>,
    /// What the door says of the run (LangGraph's: its assistant and `multitask_strategy`),
    /// kept with its first checkpoint so the run lists as started on any replica, after a
    /// restart too ([`ChatService::recorded_runs`]).
    pub run_metadata: Option<Box<serde_json::value::RawValue>>,
}

impl NewTurn {
    /// The checks every door's turn gets: a message of 1 to
    /// [`MAX_MESSAGE_CHARS`](crate::wire::MAX_MESSAGE_CHARS) characters.
    ///
    /// # Errors
    /// [`ChatError::Invalid`] naming `message`.
    pub fn validate(&self) -> Result<(), ChatError> {
        crate::wire::check_message(&self.message)
    }
}

/// A conversation's state as one of its checkpoints left it.
#[derive(Debug)]
pub struct CheckpointView {
    /// The conversation.
    pub conversation: ConversationId,
    /// The agent's state there, the node that runs next, the pause's interrupts and decisions.
    pub at: toolgraph_agents::chat_agent::StateView,
}

/// One agent the service can run.
pub struct ServedAgent {
    /// The agent, whatever its graph and state.
    pub agent: Arc<dyn ChatAgent>,
    /// Its settings (state keys, recursion limit).
    pub settings: AgentSettings,
}

impl ServedAgent {
    /// Serves `agent` with `settings`.
    pub fn new(agent: impl ChatAgent, settings: AgentSettings) -> Self {
        Self { agent: Arc::new(agent), settings }
    }
}

/// Service-wide policies.
pub struct ServiceOptions {
    /// How requests are authenticated.
    pub auth: crate::auth::Auth,
    /// Most runs one tenant may have in flight; more get 429 with `Retry-After` (0: no limit).
    pub max_runs_per_tenant: usize,
    /// This instance's name in the store's run leases: a restarted instance frees the leases it
    /// held under it ([`ChatService::recover`]), so it must be stable across restarts and unique
    /// among replicas. Default: `local`.
    pub instance_id: String,
    /// How long a run's lease on its conversation lasts without renewal (renewed every third of
    /// it): the longest a conversation stays blocked after the instance running its turn died
    /// without restarting. Default: 30 s.
    pub turn_lease: Duration,
    /// Where runs' frames are shared with other replicas, so a stream resumes on any of them
    /// (docs/service.md, "Replicas"). Default: none, runs are read where they run.
    pub run_events: Option<Arc<dyn RunEventStore>>,
    /// Look for expired leases (their replica died) this often and close their turns
    /// ([`ChatService::take_over_expired`]). Default: off, for a store no other process shares.
    pub takeover_every: Option<Duration>,
    /// The tokens each tenant's turns may use per period. Default: none.
    pub token_budget: Option<TokenBudget>,
    /// How long data is kept, pruned every [`Retention::every`] by one replica
    /// ([`ChatService::prune`]). Default: none, everything is kept.
    pub retention: Option<Retention>,
    /// Where documents attached to conversations are kept. Default: none (uploads are refused).
    pub attachments: Option<Attachments>,
    /// The embedding model and fusion that search people's items by meaning too
    /// (docs/memory.md, "Search by meaning"). Default: none, by their words.
    pub item_index: Option<toolgraph_rag::Retriever>,
}

impl Default for ServiceOptions {
    fn default() -> Self {
        Self {
            auth: crate::auth::Auth::None,
            max_runs_per_tenant: 0,
            instance_id: "local".into(),
            turn_lease: Duration::from_secs(30),
            run_events: None,
            takeover_every: None,
            token_budget: None,
            retention: None,
            attachments: None,
            item_index: None,
        }
    }
}

/// How many of `stored`'s last messages are `wrote` (a run's, in order), with the fallback
/// reply the service writes itself after a run that hit its step limit; none when they are
/// not exactly those.
fn tail_written(stored: &[toolgraph_conversations::StoredMessage], wrote: &[(Role, String)]) -> Option<usize> {
    let mut at = stored.len();
    let mut expected = wrote.iter().rev().peekable();
    while let Some(m) = at.checked_sub(1).map(|i| &stored[i]) {
        match expected.peek() {
            Some((role, content)) if *role == m.role && *content == m.content => {
                expected.next();
            }
            _ if m.role == Role::Assistant && m.content == turn::RECURSION_FALLBACK && at == stored.len() => {}
            _ => break,
        }
        at -= 1;
        if expected.peek().is_none() {
            break;
        }
    }
    expected.peek().is_none().then_some(stored.len() - at)
}

/// The `error` a client following a turn gets when the turn's replica died mid-way.
pub const INTERRUPTED_ERROR: &str =
    "this turn was interrupted (the service running it stopped); its conversation is free, please ask again";

/// Most expired turns one store call takes over.
const TAKEOVER_BATCH: usize = 100;
/// Taken-over turns closed at once.
const TAKEOVER_CONCURRENCY: usize = 16;

/// What a confirm answers.
#[derive(Debug)]
pub enum Confirmed {
    /// The group was already resumed: its stored response, as it was sent the first time.
    Saved(String),
    /// The response of this decision.
    Reply(ConfirmResponse),
}

impl Confirmed {
    /// The response as it was sent: a stored one read back.
    ///
    /// # Errors
    /// `Internal` for a stored response that does not read back.
    pub fn into_reply(self) -> Result<ConfirmResponse, ChatError> {
        match self {
            Confirmed::Reply(reply) => Ok(reply),
            Confirmed::Saved(text) => serde_json::from_str(&text)
                .map_err(|e| ChatError::Internal(format!("a stored response that does not read back: {e}"))),
        }
    }
}

/// What decisions asked with [`Resumption::Streamed`] did: answered as a confirm is (the pause
/// waits for more, or was resumed already), or started the resumed run.
#[derive(Debug)]
pub enum Resuming {
    /// No run started: what a confirm answers.
    Answered(Confirmed),
    /// The resumed run, started: its frames stream from its log as a turn's do.
    Started(ResumedRun),
}

/// A run resumed by decisions, running detached: it finishes and keeps its response whether or
/// not anyone reads it.
#[derive(Debug)]
pub struct ResumedRun {
    /// Its frames, as a turn's.
    pub log: Arc<RunLog>,
    /// Its response once it has ended (the one a confirm of the same decisions is answered with
    /// again), or why it failed.
    pub outcome: tokio::task::JoinHandle<Result<ConfirmResponse, String>>,
}

/// How decisions that complete a pause resume its run.
#[derive(Debug, Clone)]
pub enum Resumption {
    /// The request waits for the run's end: its reply is the response (the confirm routes).
    Awaited,
    /// The run is handed back as it starts, its log carrying tool frames — and node frames
    /// when `node_events` — for a client that streams it (LangGraph's `command.resume`,
    /// AG-UI's `resume`). `metadata` is kept on the resumed run's first checkpoint, as a
    /// turn's [`NewTurn::run_metadata`] is.
    Streamed { node_events: bool, metadata: Option<Box<serde_json::value::RawValue>> },
}

/// The chat service. Cheap to clone.
#[derive(Clone)]
pub struct ChatService(Arc<Inner>);

/// How many of a person's newest conversations [`ChatService::conversation_asking`] looks at.
pub const RECOGNISED_AMONG: usize = 20;

struct Inner {
    agents: BTreeMap<String, ServedAgent>,
    default_agent: String,
    store: Arc<dyn ConversationStore>,
    checkpointer: Arc<dyn Checkpointer>,
    runs: Arc<RunLogs>,
    /// Set when runs are shared with other replicas.
    shared: Option<Arc<SharedRuns>>,
    /// The relay publishing this replica's frames, awaited at shutdown.
    relay: Mutex<Option<tokio::task::JoinHandle<()>>>,
    metrics: Metrics,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    options: ServiceOptions,
    /// Run slots by numeric tenant id (turns and decisions).
    tenant_slots: Slots<i64>,
    /// Request slots by tenant slug (`/search`, `/mcp`: their requests name no numeric id).
    slug_slots: Slots<String>,
    /// When expired memory items were last deleted, ms since the epoch ([`items`]).
    items_pruned_at: std::sync::atomic::AtomicI64,
    /// Tenants' token spending as last read, for their budgets ([`usage`]).
    spent: usage::SpentCache,
    /// Uploads parsed at once ([`attachments`]): a document's parse is CPU work.
    parsing: Semaphore,
}

/// Per-tenant semaphores, created on first use and dropped once idle, so tenant ids a client
/// invents cannot grow the map without bound.
struct Slots<K>(Mutex<HashMap<K, Arc<Semaphore>>>);

/// Past this many tenants in a map, idle ones are dropped on the next admission.
const SLOTS_PRUNE_AT: usize = 1024;

impl<K: std::hash::Hash + Eq> Slots<K> {
    fn new() -> Self {
        Self(Mutex::new(HashMap::new()))
    }

    /// A slot of `key` out of `limit` (none to take when `limit` is 0). The key is copied
    /// only for a tenant seen for the first time.
    fn admit<Q>(&self, key: &Q, limit: usize) -> Result<Option<OwnedSemaphorePermit>, ChatError>
    where
        K: std::borrow::Borrow<Q>,
        Q: std::hash::Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if limit == 0 {
            return Ok(None);
        }
        let slots = {
            let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
            if map.len() >= SLOTS_PRUNE_AT {
                // A held permit keeps its semaphore's count above one: the rest are idle.
                map.retain(|_, s| Arc::strong_count(s) > 1);
            }
            match map.get(key) {
                Some(slots) => Arc::clone(slots),
                None => Arc::clone(map.entry(key.to_owned()).or_insert_with(|| Arc::new(Semaphore::new(limit)))),
            }
        };
        slots.try_acquire_owned().map(Some).map_err(|_| ChatError::TooManyRuns { limit })
    }

    fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// The state context of a turn: the request's values plus `tenant` (the slug), which tools
/// such as `rag_search` scope their reads by. Set by the service, never taken from the client;
/// a continuing turn without new context keeps the stored one (it already has the tenant).
fn turn_context(req: &NewTurn, is_new: bool) -> Option<Map<String, Value>> {
    if req.context.is_none() && !is_new {
        return None;
    }
    let mut ctx = req.context.clone().unwrap_or_default();
    ctx.insert("tenant".into(), req.tenant_slug.clone().into());
    Some(ctx)
}

/// Who is asking, set over the turn's context on every turn (continuing ones too, whatever
/// the stored context holds): `tenant` (the slug), `tenantId`, `userId` and `conversationId`,
/// which the backend's tools act for. They overwrite any context value of the same name.
fn turn_identity(who: &Principal, req: &NewTurn, conversation: i64) -> Map<String, Value> {
    let mut ids = Map::new();
    ids.insert("tenant".into(), req.tenant_slug.clone().into());
    ids.insert("tenantId".into(), who.tenant().0.into());
    ids.insert("userId".into(), who.user().0.into());
    ids.insert("conversationId".into(), conversation.into());
    ids
}

impl ChatService {
    /// The service over `agents` (by name), `store` and the checkpoint store the agents use.
    /// Called inside a Tokio runtime: with replicas, it starts the relay that publishes runs
    /// and the sweep that takes over expired turns.
    pub fn new(
        agents: BTreeMap<String, ServedAgent>,
        default_agent: String,
        store: Arc<dyn ConversationStore>,
        checkpointer: Arc<dyn Checkpointer>,
        options: ServiceOptions,
    ) -> Self {
        let shared = options.run_events.clone().map(|events| Arc::new(SharedRuns::new(events)));
        let runs = Arc::new(match &shared {
            Some(shared) => RunLogs::published(shared.unpublished()),
            None => RunLogs::default(),
        });
        let relay = shared.as_ref().map(|s| tokio::spawn(Arc::clone(s).relay(Arc::clone(&runs))));
        let takeover_every = options.takeover_every;
        let prune_every = options.retention.as_ref().filter(|r| r.background).map(|r| r.every);
        let service = Self(Arc::new(Inner {
            agents,
            default_agent,
            store,
            checkpointer,
            runs,
            shared,
            relay: Mutex::new(relay),
            metrics: Metrics::default(),
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
            options,
            tenant_slots: Slots::new(),
            slug_slots: Slots::new(),
            items_pruned_at: std::sync::atomic::AtomicI64::new(0),
            spent: usage::SpentCache::default(),
            parsing: Semaphore::new(2),
        }));
        if let Some(every) = takeover_every {
            service.sweep_expired(every);
        }
        if let Some(every) = prune_every {
            service.prune_periodically(every);
        }
        service
    }

    /// Takes over expired turns every `every` until shutdown.
    fn sweep_expired(&self, every: Duration) {
        self.every(every.max(Duration::from_millis(50)), |service| async move {
            if let Err(e) = service.take_over_expired().await {
                tracing::warn!(error = %e, "cannot look for expired turns");
            }
        });
    }

    /// Runs `work` every `every` (the first at once) until shutdown, one run at a time. Holds
    /// the service weakly: a periodic task never keeps a dropped service alive.
    pub(super) fn every<F, W>(&self, every: Duration, work: W)
    where
        W: Fn(ChatService) -> F + Send + 'static,
        F: std::future::Future<Output = ()> + Send,
    {
        let (weak, shutdown) = (Arc::downgrade(&self.0), self.0.shutdown.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let Some(inner) = weak.upgrade() else { return };
                work(ChatService(inner)).await;
            }
        });
    }

    /// Takes over the turns whose lease expired (the replica running them died, or hung past
    /// its lease) and closes each: its conversation's history says the turn was interrupted
    /// (a resume that had not got past its first step leaves its pause waiting again instead),
    /// a client following it gets an `error`, and the conversation is free. A write action
    /// in flight is never run again: the closed turn records it as possibly not carried out.
    /// Returns how many turns it closed.
    ///
    /// # Errors
    /// `Store` when the leases cannot be read.
    pub async fn take_over_expired(&self) -> Result<usize, ChatError> {
        let mut closed = 0;
        // Batch after batch until none is left: a dead replica may have held thousands.
        loop {
            let claim = self.claim();
            let taken = self.0.store.take_over_expired(&claim, TAKEOVER_BATCH).await?;
            let batch = taken.len();
            // Closed several at a time: each is a few store round trips, and their clients wait.
            let closing = futures::stream::iter(taken).map(|t| {
                let (service, run) = (self.clone(), claim.run_id.clone());
                async move {
                    tracing::warn!(conversation = t.conversation_id, run = %t.run_id, "took over a turn whose lease expired");
                    let was_open = service.close_turn(&t).await;
                    service.release(t.conversation_id, &run).await;
                    was_open
                }
            });
            let closing: Vec<bool> = closing.buffer_unordered(TAKEOVER_CONCURRENCY).collect().await;
            closed += closing.into_iter().filter(|c| *c).count();
            if batch < TAKEOVER_BATCH || self.0.shutdown.is_cancelled() {
                return Ok(closed);
            }
        }
    }

    /// Closes an interrupted turn: a stop record with the interrupted reply in its graph (for a
    /// resume not past its first step, the mark that its pause waits again), then
    /// an `error` ending its stream for readers on any replica — in that order, so a client
    /// that reads the conversation once its stream ended finds the turn closed there (the
    /// other order let such a read see the question without its reply). Whether the graph had
    /// a run to close.
    async fn close_turn(&self, t: &ReleasedTurn) -> bool {
        self.0.metrics.errors.with_label_values(&["interrupted"]).inc();
        let closed = match self.0.agents.get(&t.agent) {
            None => {
                tracing::warn!(conversation = t.conversation_id, agent = %t.agent, "an interrupted turn's agent is gone");
                false
            }
            Some(agent) => {
                let thread = ConversationThread { tenant: t.tenant_id, conversation: t.conversation_id }.thread_id();
                agent.agent.close_interrupted(&thread).await.unwrap_or_else(|e| {
                    tracing::warn!(conversation = t.conversation_id, error = %e, "cannot close an interrupted turn");
                    false
                })
            }
        };
        if let Some(shared) = &self.0.shared
            && !t.run_id.is_empty()
            && let Err(e) =
                shared.end_run(&t.run_id, (t.tenant_id, t.user_id), t.conversation_id, INTERRUPTED_ERROR).await
        {
            tracing::warn!(run = %t.run_id, error = %e, "cannot end an interrupted turn's stream");
        }
        closed
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Metrics {
        &self.0.metrics
    }

    /// How requests are authenticated.
    pub(crate) fn auth(&self) -> &crate::auth::Auth {
        &self.0.options.auth
    }

    /// A run slot of `tenant`, held by the run until it ends.
    fn admit(&self, tenant: i64) -> Result<Option<OwnedSemaphorePermit>, ChatError> {
        self.0.tenant_slots.admit(&tenant, self.0.options.max_runs_per_tenant)
    }

    /// A slot of the tenant `slug` for a request that is not a run (`/search`, `/mcp`), held
    /// until it is answered: the same limit as runs, so a tenant cannot flood the service
    /// through the routes that start no turn.
    ///
    /// # Errors
    /// `TooManyRuns` at the limit.
    pub(crate) fn admit_request(&self, slug: &str) -> Result<Option<OwnedSemaphorePermit>, ChatError> {
        self.0.slug_slots.admit(slug, self.0.options.max_runs_per_tenant)
    }

    /// How many tenants have run slots in memory (idle ones are dropped as the map grows).
    pub fn tenant_slot_count(&self) -> usize {
        self.0.tenant_slots.len()
    }

    /// A lease on a conversation for a new run of this instance.
    fn claim(&self) -> TurnClaim {
        TurnClaim {
            run_id: uuid::Uuid::now_v7().to_string(),
            owner: self.0.options.instance_id.clone(),
            lease_ms: self.0.options.turn_lease.as_millis() as i64,
        }
    }

    /// A run's options: it holds its conversation's lease, so a run found dead mid-way on the
    /// thread is closed rather than waited for.
    fn run_options(
        &self,
        agent: &ServedAgent,
        cancel: &CancellationToken,
        run_id: &str,
        metadata: Option<Box<serde_json::value::RawValue>>,
    ) -> RunOptions {
        RunOptions {
            metadata,
            recursion_limit: agent.settings.recursion_limit,
            cancel: cancel.clone(),
            owns_thread: true,
            // The records carry the service's run id: a run is rolled back by it.
            run_id: Some(run_id.to_owned()),
            ..RunOptions::default()
        }
    }

    /// Frees the leases this instance held before it restarted and closes the turns they
    /// belonged to, so their conversations are usable at once and their history says the turn
    /// was interrupted. Run before the service reports ready; returns how many turns it closed.
    ///
    /// # Errors
    /// `Store` when the leases cannot be read; a turn that cannot be closed is logged and left
    /// for its conversation's next turn, which closes it too.
    pub async fn recover(&self) -> Result<usize, ChatError> {
        let released = self.0.store.release_owner(&self.0.options.instance_id).await?;
        let mut closed = 0;
        for r in &released {
            if self.close_turn(r).await {
                closed += 1;
            }
        }
        if closed > 0 {
            tracing::warn!(closed, "closed turns interrupted when this instance last stopped");
        }
        Ok(closed)
    }

    /// Starts a turn of `req` (validated by the caller) for `who`: a new conversation or the
    /// next turn of theirs, on its agent. Returns the run's id and its frame log, which the run fills
    /// whether or not anyone reads it.
    ///
    /// # Errors
    /// [`ChatError::NotFound`] for a conversation that is not the caller's; `Invalid` for an
    /// agent or context key the conversation's agent does not take; `Busy` while another run
    /// holds the conversation; `AwaitingDecision` while decisions are pending; `TooManyRuns`;
    /// `Store`.
    pub async fn start_turn(&self, who: &Principal, req: &NewTurn) -> Result<(RunId, Arc<RunLog>), ChatError> {
        let store = &self.0.store;
        let (tenant, user) = (who.tenant().0, who.user().0);
        let existing = match req.conversation {
            Some(id) => Some(store.conversation(tenant, user, id.0).await?.ok_or(ChatError::NotFound)?),
            None => None,
        };
        if let (Some(asked), Some(conv)) = (&req.agent, &existing)
            && *asked != conv.agent
        {
            // Its checkpoints and pending actions belong to that agent's graph and tools.
            return Err(ChatError::Invalid {
                field: "agent".into(),
                message: format!("conversation {} belongs to agent '{}'", conv.id, conv.agent),
            });
        }
        let agent_name = req
            .agent
            .clone()
            .or_else(|| existing.as_ref().map(|c| c.agent.clone()))
            .unwrap_or_else(|| self.0.default_agent.clone());
        let agent = self.0.agents.get(&agent_name).ok_or_else(|| ChatError::Invalid {
            field: "agent".into(),
            message: format!("no agent named '{}'", crate::error::echoed(&agent_name)),
        })?;
        if let Some(ctx) = &req.context
            && let Some(k) = ctx.keys().find(|k| !agent.settings.state_keys.contains(k))
        {
            let k = crate::error::echoed(k);
            return Err(ChatError::Invalid {
                field: format!("context.{k}"),
                message: format!("agent '{agent_name}' does not accept context key '{k}'"),
            });
        }
        let is_new = existing.is_none();
        // Admitted before anything is written: a refused turn leaves no empty conversation.
        self.check_budget(tenant).await?;
        let permit = self.admit(tenant)?;
        let uploads = self.uploads_to_attach(who, &req.attachments).await?;
        let conversation = match existing {
            Some(c) => c.id,
            None => store.create_conversation(tenant, user, &agent_name).await?,
        };
        let claim = self.claim();
        if !store.begin_turn(conversation, &claim).await? {
            // Deleted meanwhile (by its person, or by retention) rather than busy.
            if store.conversation(tenant, user, conversation).await?.is_none() {
                return Err(ChatError::NotFound);
            }
            return Err(ChatError::Busy);
        }
        let attaching: Vec<String> = uploads.iter().map(|u| u.id.clone()).collect();
        if let Err(e) = self.attach(who, conversation, is_new, &claim, uploads).await {
            self.release(conversation, &claim.run_id).await;
            if is_new {
                // Nothing of it was asked yet: the turn leaves no empty conversation.
                self.forget_new_conversation(tenant, user, conversation).await;
            }
            return Err(e);
        }
        let run_id = claim.run_id.clone();
        let cancel = self.0.shutdown.child_token();
        let turn = Turn {
            tenant,
            conversation,
            agent: agent_name,
            claim,
            cancel: cancel.clone(),
            tool_events: req.tool_events,
            node_events: req.node_events,
        };
        // The user's message is committed with the run's first checkpoint (see the
        // conversations crate's projection).
        let thread = ConversationThread { tenant, conversation }.thread_id();
        let input = TurnInput {
            message: req.message.clone(),
            context: turn_context(req, is_new),
            identity: turn_identity(who, req, conversation),
        };
        let run = match agent
            .agent
            .start(&thread, input, self.run_options(agent, &cancel, &run_id, req.run_metadata.clone()))
            .await
        {
            Ok(run) => run,
            Err(e) => {
                self.release(conversation, &run_id).await;
                return Err(match e {
                    GraphError::AwaitingDecision { .. } => {
                        ChatError::AwaitingDecision(self.undecided_actions(agent, &thread, conversation).await)
                    }
                    GraphError::ConcurrentRun { .. } => ChatError::Busy,
                    e => ChatError::Internal(e.to_string()),
                });
            }
        };
        // Attached, and the turn runs: the uploads are spent (a refused turn kept them to retry).
        if !attaching.is_empty()
            && let Err(e) = store.delete_uploads(tenant, user, &attaching).await
        {
            tracing::warn!(error = %e, "cannot delete attached uploads; they expire in a day");
        }
        let log =
            self.0.runs.create(&run_id, (tenant, user), ConversationId(conversation), &turn.agent, cancel.clone());
        let (service, task_log, served) = (self.clone(), Arc::clone(&log), Arc::clone(&agent.agent));
        self.0.tasks.spawn(async move {
            let _slot = permit;
            let _ends = turn::EndsLog(Arc::clone(&task_log));
            turn::drive(&service, served.as_ref(), &turn, run, &task_log).await;
        });
        Ok((RunId(run_id), log))
    }

    /// The actions the conversation's pause waits on, in message order: those still waiting
    /// for a decision — or all of them when every one is decided and no run applied them
    /// (empty when they cannot be read: the refusal stands without them).
    async fn undecided_actions(
        &self,
        agent: &ServedAgent,
        thread: &toolgraph_graph::ThreadId,
        conversation: i64,
    ) -> Vec<PendingActionDto> {
        let Ok(Some((_, head_run))) = agent.agent.checkpointer().head(thread).await else { return Vec::new() };
        match self.0.store.run_pending(conversation, &head_run).await {
            // Every action decided and none applied (no outcome saved), yet the thread's head is
            // still the pause's: no run took the decisions over (its resume ended before its
            // first step, or the request that decided them failed before resuming). The
            // actions wait again; the same decisions resume them, others are refused.
            Ok(rows) if rows.iter().all(|p| p.decision.is_some() && p.response.is_none()) => {
                rows.iter().map(PendingActionDto::from).collect()
            }
            Ok(rows) => rows.iter().filter(|p| p.decision.is_none()).map(PendingActionDto::from).collect(),
            Err(e) => {
                tracing::warn!(error = %e, conversation, "cannot list the pending actions for the refusal");
                Vec::new()
            }
        }
    }

    /// Records `who`'s decision on pending action `message` of `conversation`: approve it
    /// (`confirmed`) or reject it. While others of its group are
    /// undecided, answers the next one; once the last is decided, resumes the run and answers
    /// its outcome (the final reply, or the next pending action). The same decision again
    /// answers what the first did, without running anything twice.
    ///
    /// # Errors
    /// `NotFound` for an action that is not the caller's; `Conflict` for the opposite decision
    /// after one was recorded, or while the group is being resumed; `TooManyRuns`;
    /// `RunFailed` when the resumed run ends without an answer; `Store`.
    pub async fn confirm(
        &self,
        who: &Principal,
        conversation: ConversationId,
        message: MessageId,
        confirmed: bool,
    ) -> Result<Confirmed, ChatError> {
        Self::settled(
            self.decide(&lookup(who, conversation, message), confirmed, None, None, Resumption::Awaited).await?,
        )
        .await
    }

    /// Answers `who`'s question `message` of `conversation` (a pending action whose tool is
    /// [`QUESTION`]) with `answer`: the answer is checked against the question's form, recorded
    /// once, and the run resumes with it. Same outcomes and exactly-once rules as
    /// [`ChatService::confirm`].
    ///
    /// # Errors
    /// `Invalid` for an answer that does not fit the question, or an action that is an
    /// approval (decided at `/confirm`); otherwise as [`ChatService::confirm`].
    pub async fn answer(
        &self,
        who: &Principal,
        conversation: ConversationId,
        message: MessageId,
        answer: &Value,
    ) -> Result<Confirmed, ChatError> {
        let lookup = lookup(who, conversation, message);
        Self::settled(self.decide(&lookup, true, Some(answer), None, Resumption::Awaited).await?).await
    }

    /// Records `who`'s decisions on pending actions of `conversation` at once — approve, reject
    /// (with a message the model reads, or not), edit (approve with other arguments, checked
    /// against the action's schema), respond (the person's answer in the call's place), or
    /// answer a question — and resumes the run once its group is decided, with each decision
    /// as given. Every decision is checked before the first is recorded; each is recorded
    /// exactly once (the store keeps approve or not, as `/confirm` does). The last decision's
    /// outcome, as [`ChatService::confirm`] answers it — or, `how` being
    /// [`Resumption::Streamed`], the run the decisions resumed, handed back as it starts for its
    /// frames to be streamed.
    ///
    /// The store keeps yes or no, as `/confirm` records it; what an edit, a rejection's
    /// message or a response says is recorded in the run's checkpoints right after, before any
    /// resume, so whichever request resumes the run — this one, a retry, `/confirm` on another
    /// replica — resumes it with what the person said.
    ///
    /// # Errors
    /// `Invalid` for an edit whose arguments do not fit, or a decision the action does not
    /// take; `Conflict` for other details than those recorded; otherwise as
    /// [`ChatService::confirm`].
    pub async fn decide_all(
        &self,
        who: &Principal,
        conversation: ConversationId,
        decisions: Vec<(MessageId, Decision)>,
        how: Resumption,
    ) -> Result<Resuming, ChatError> {
        for (message, decision) in &decisions {
            if let Decision::Edit(arguments) = decision {
                self.check_edit(who, conversation, *message, arguments).await?;
            }
        }
        let mut last = None;
        for (message, decision) in decisions {
            let (confirmed, answer, detail) = match decision {
                Decision::Approve => (true, None, None),
                Decision::Answer(answer) => (true, Some(answer), None),
                Decision::Reject => (false, None, None),
                d @ Decision::Edit(_) => (true, None, Some(d)),
                d @ (Decision::RejectWith(_) | Decision::Respond(_)) => (false, None, Some(d)),
            };
            let lookup = lookup(who, conversation, message);
            match self.decide(&lookup, confirmed, answer.as_ref(), detail, how.clone()).await? {
                // The group is decided (by this request, or the rest by another at the same
                // time): the run it resumed is the outcome.
                started @ Resuming::Started(_) => {
                    return match how {
                        Resumption::Awaited => Ok(Resuming::Answered(Self::settled(started).await?)),
                        Resumption::Streamed { .. } => Ok(started),
                    };
                }
                answered => last = Some(answered),
            }
        }
        last.ok_or_else(|| ChatError::Invalid { field: "decisions".into(), message: "no decisions".into() })
    }

    /// What a confirm answers for `resuming`: a started run's response once it has ended.
    async fn settled(resuming: Resuming) -> Result<Confirmed, ChatError> {
        let run = match resuming {
            Resuming::Answered(confirmed) => return Ok(confirmed),
            Resuming::Started(run) => run,
        };
        match run.outcome.await {
            Ok(Ok(r)) => Ok(Confirmed::Reply(r)),
            Ok(Err(message)) => Err(ChatError::RunFailed(message)),
            Err(e) => Err(ChatError::Internal(e.to_string())),
        }
    }

    /// Whether `arguments` may replace those of `who`'s pending action `message`: an object
    /// that fits the JSON Schema the action's pause recorded for them.
    async fn check_edit(
        &self,
        who: &Principal,
        conversation: ConversationId,
        message: MessageId,
        arguments: &Value,
    ) -> Result<(), ChatError> {
        let invalid = |message: String| ChatError::Invalid { field: "args".into(), message };
        let row = self.0.store.pending(&lookup(who, conversation, message)).await?.ok_or(ChatError::NotFound)?;
        if row.action.tool_name == QUESTION {
            return Err(invalid("a question is answered, not edited".into()));
        }
        if !arguments.is_object() {
            return Err(invalid("edited arguments are an object of the tool's arguments".into()));
        }
        let (agent, thread) = self.conversation_thread(who, conversation).await?;
        let view = agent.agent.current_state(&thread).await.map_err(internal)?.ok_or(ChatError::NotFound)?;
        let id = InterruptId(row.action.interrupt_id.clone());
        let schema = view.pending.iter().find(|p| p.id == id).map(|p| &p.payload["parameters"]);
        match schema {
            None => Err(ChatError::conflict("this action is no longer waiting for a decision")),
            // A pause recorded before schemas were: the tool checks its arguments when it runs.
            Some(Value::Null) => Ok(()),
            Some(schema) => toolgraph_agents::chat_agent::check_arguments(schema, arguments).map_err(invalid),
        }
    }

    /// Records a decision on pending action `lookup` — approve or reject, or `answer` a
    /// question — and resumes its run once its group is decided, as `how` says.
    async fn decide(
        &self,
        lookup: &PendingLookup,
        confirmed: bool,
        answer: Option<&Value>,
        detail: Option<Decision>,
        how: Resumption,
    ) -> Result<Resuming, ChatError> {
        let store = &self.0.store;
        let conv = lookup.conversation_id;
        let row = store.pending(lookup).await?.ok_or(ChatError::NotFound)?;
        let invalid = |message: String| ChatError::Invalid { field: "answer".into(), message };
        // A question is answered (or declined: confirmed = false), never approved; an approval
        // is never answered.
        let question = row.action.tool_name == QUESTION;
        let answer = match (question, answer) {
            (true, Some(a)) => Some(check_answer(row.action.arguments.get("form"), a).map_err(invalid)?),
            (true, None) if confirmed => {
                return Err(invalid(
                    "this pending action is a question: answer it with POST /api/chatbot/answer (or decline it \
                     with confirmed = false)"
                        .into(),
                ));
            }
            (false, Some(_)) => {
                return Err(invalid(format!(
                    "this pending action asks to run {}: approve or reject it with POST /api/chatbot/confirm",
                    row.action.tool_name
                )));
            }
            (_, None) => None,
        };
        // What the store's yes or no does not say is kept where every resume reads it, before
        // the store's: a resume that finds the pause decided finds the details too.
        if let Some(detail) = detail.filter(|_| row.response.is_none()) {
            if row.decision.is_some_and(|d| d != confirmed) {
                return Err(ChatError::conflict("this action was already decided the other way"));
            }
            let (agent, thread) = self.thread_of((lookup.tenant_id, lookup.user_id), conv).await?;
            let id = InterruptId(row.action.interrupt_id.clone());
            match agent.agent.record_decisions(&thread, BTreeMap::from([(id, detail)])).await {
                Ok(()) => {}
                Err(GraphError::ConflictingDecision(_)) => {
                    return Err(ChatError::conflict("this action was already decided with other details"));
                }
                Err(GraphError::UnknownInterrupt(_) | GraphError::NothingToResume(_)) => {
                    return Err(ChatError::conflict("this action is no longer waiting for a decision"));
                }
                Err(GraphError::ConcurrentRun { .. }) => {
                    return Err(ChatError::conflict("another request is deciding this pause; retry shortly"));
                }
                Err(e) => return Err(internal(e)),
            }
        }
        match store.decide(lookup.message_id, confirmed).await? {
            Decided::Conflict => return Err(ChatError::conflict("this action was already decided the other way")),
            Decided::Same => {
                // The store keeps that a question was answered, the run's checkpoints what the
                // answer was: another answer than the recorded one is refused, never applied.
                if let Some(answer) = &answer
                    && let Some(recorded) = self.recorded_answer(lookup, &row.action.interrupt_id).await?
                    && recorded != *answer
                {
                    return Err(ChatError::conflict("this question was already answered with another answer"));
                }
                if let Some(saved) = row.response {
                    return Ok(Resuming::Answered(Confirmed::Saved(saved)));
                }
            }
            Decided::Recorded => {
                self.0.metrics.hitl.with_label_values(&[if confirmed { "true" } else { "false" }]).inc();
            }
        }
        let group_run = row.action.run_id;
        let group = store.run_pending(conv, &group_run).await?;
        if answer.is_some() && group.len() > 1 {
            // Only its own answer is at hand: a question is answered in a pause of its own.
            return Err(ChatError::conflict("this pause asks for more than one thing; a question must pause alone"));
        }
        if let Some(next) = group.iter().find(|p| p.decision.is_none()) {
            let pending_action = Some(PendingActionDto::from(next));
            return Ok(Resuming::Answered(Confirmed::Reply(ConfirmResponse {
                conversation_id: ConversationId(conv),
                message: String::new(),
                pending_action,
            })));
        }
        let conversation =
            store.conversation(lookup.tenant_id, lookup.user_id, conv).await?.ok_or(ChatError::NotFound)?;
        let agent = self
            .0
            .agents
            .get(&conversation.agent)
            .ok_or_else(|| ChatError::Internal(format!("agent '{}' is gone", conversation.agent)))?;
        // The decision is kept either way: the same request after the budget renews resumes.
        self.check_budget(lookup.tenant_id).await?;
        let permit = self.admit(lookup.tenant_id)?;
        let claim = self.claim();
        // Every action is decided and no answer is stored yet: resume, unless another request
        // (or the turn that paused) holds the conversation right now. A retry after that turn
        // ends resumes, so a decision recorded by a request that then failed is never stranded.
        if !store.begin_turn(conv, &claim).await? {
            if store.conversation(lookup.tenant_id, lookup.user_id, conv).await?.is_none() {
                return Err(ChatError::NotFound);
            }
            return Err(ChatError::conflict("these decisions are being applied; retry shortly"));
        }
        let decisions: BTreeMap<InterruptId, Decision> = group
            .iter()
            .map(|p| {
                // Yes or no, as the store keeps it; the checkpoints keep the details it covers.
                let decision = match (p.decision, &answer) {
                    // This request's answer: a question pauses alone, so its group is itself.
                    (Some(true), Some(a)) if p.message_id == lookup.message_id => Decision::Answer(a.clone()),
                    (Some(true), _) => Decision::Approve,
                    _ => Decision::Reject,
                };
                (InterruptId(p.action.interrupt_id.clone()), decision)
            })
            .collect();
        let thread = ConversationThread { tenant: lookup.tenant_id, conversation: conv }.thread_id();
        let cancel = self.0.shutdown.child_token();
        // Nobody streams a confirm's run: its outcome is the response. A streamed resume's
        // frames are a turn's.
        let (tool_events, node_events, metadata) = match how {
            Resumption::Awaited => (false, false, None),
            Resumption::Streamed { node_events, metadata } => (true, node_events, metadata),
        };
        let run = match agent
            .agent
            .resume(&thread, decisions, self.run_options(agent, &cancel, &claim.run_id, metadata))
            .await
        {
            Ok(Resumed::Started(run)) => run,
            Ok(Resumed::Waiting) | Err(_) => {
                self.release(conv, &claim.run_id).await;
                return Err(ChatError::conflict("these actions cannot be resumed now"));
            }
        };
        let owner = (lookup.tenant_id, lookup.user_id);
        let log = self.0.runs.create(&claim.run_id, owner, ConversationId(conv), &conversation.agent, cancel.clone());
        let turn = Turn {
            tenant: lookup.tenant_id,
            conversation: conv,
            agent: conversation.agent,
            claim,
            cancel,
            tool_events,
            node_events,
        };
        // Detached: the run finishes and persists even if this request goes away.
        let (service, served, frames) = (self.clone(), Arc::clone(&agent.agent), Arc::clone(&log));
        let outcome = self.0.tasks.spawn(async move {
            let _slot = permit;
            let _ends = turn::EndsLog(Arc::clone(&log));
            let result = turn::drive(&service, served.as_ref(), &turn, run, &log).await;
            let response = match (result.error, result.reply, result.pending.into_iter().next()) {
                (Some(e), _, _) => Err(e),
                (None, _, Some(p)) => Ok(ConfirmResponse {
                    conversation_id: ConversationId(conv),
                    message: String::new(),
                    pending_action: Some(p),
                }),
                (None, Some((_, text)), None) => {
                    Ok(ConfirmResponse { conversation_id: ConversationId(conv), message: text, pending_action: None })
                }
                (None, None, None) => Err("the run ended without a reply".to_owned()),
            };
            if let Ok(r) = &response {
                let text = serde_json::to_string(r).unwrap_or_default();
                if let Err(e) = service.0.store.set_response(conv, &group_run, &text).await {
                    tracing::error!(error = %e, "cannot save the confirm response");
                }
            }
            response
        });
        Ok(Resuming::Started(ResumedRun { log: frames, outcome }))
    }

    /// The answer the checkpoints of `lookup`'s conversation recorded for `interrupt`, if a
    /// resume got that far (the last decisions of the thread are looked at).
    async fn recorded_answer(&self, lookup: &PendingLookup, interrupt: &str) -> Result<Option<Value>, ChatError> {
        let (agent, thread) = self.thread_of((lookup.tenant_id, lookup.user_id), lookup.conversation_id).await?;
        let history = agent.agent.history(&thread).await.map_err(internal)?;
        let id = InterruptId(interrupt.to_owned());
        let decisions: Vec<u64> =
            history.iter().rev().filter(|m| m.kind == RecordKind::Decision).take(8).map(|m| m.seq).collect();
        for view in agent.agent.states_at(&thread, &decisions).await.map_err(internal)? {
            if let Some(decision) = view.decisions.get(&id) {
                return Ok(match decision {
                    Decision::Answer(value) => Some(value.clone()),
                    _ => None,
                });
            }
        }
        Ok(None)
    }

    /// The frame log of run `run` if it is `who`'s.
    pub fn run_log(&self, run: &RunId, who: &Principal) -> Option<Arc<RunLog>> {
        self.0.runs.get(run.as_str(), who.ids())
    }

    /// The logs this replica keeps of runs on `who`'s conversation `id` (running, or ended in
    /// the last [`RETAIN_FINISHED`](crate::runlog::RETAIN_FINISHED)), newest first.
    pub fn runs_of(&self, who: &Principal, id: ConversationId) -> Vec<Arc<RunLog>> {
        self.0.runs.of_conversation(who.ids(), id)
    }

    /// The run in progress on `who`'s conversation `id` on this replica, if any.
    pub fn running_run(&self, who: &Principal, id: ConversationId) -> Option<Arc<RunLog>> {
        self.runs_of(who, id).into_iter().find(|l| !l.outcome().0)
    }

    /// Whether the service is shutting down (a cancelled run was stopped by it, not a client).
    pub(crate) fn shutting_down(&self) -> bool {
        self.0.shutdown.is_cancelled()
    }

    /// The frames of `who`'s run `run` after `after` — from this replica's log (with the
    /// conversation it is a turn of), or another replica's through the shared store — or `None`
    /// when no run of theirs has that id.
    ///
    /// # Errors
    /// Why the shared store cannot be read (logged).
    pub(crate) async fn run_frames(
        &self,
        run: &RunId,
        who: &Principal,
        after: u64,
    ) -> Result<Option<(Option<ConversationId>, futures::stream::BoxStream<'static, crate::runlog::Frame>)>, String>
    {
        let (run_id, owner) = (run.as_str(), who.ids());
        if let Some(log) = self.run_log(run, who) {
            // Another replica may have deleted a finished run's conversation (its person, or
            // retention): the frames went with it there, and go here now.
            let conversation = log.conversation.0;
            if log.outcome().0 && matches!(self.0.store.conversation(owner.0, owner.1, conversation).await, Ok(None)) {
                self.0.runs.forget(RunScope::Conversation { tenant: owner.0, conversation });
                return Ok(None);
            }
            return Ok(Some((Some(log.conversation), Box::pin(log.frames_after(after)))));
        }
        // Not run here: another replica's, read from the shared store.
        let Some(shared) = self.shared_runs() else { return Ok(None) };
        let found = async {
            let Some(frames) = shared.follow(run_id, owner, after).await? else { return Ok(None) };
            let conversation = shared.conversation_of(run_id, owner).await?.map(ConversationId);
            Ok(Some((conversation, Box::pin(frames) as futures::stream::BoxStream<'static, _>)))
        };
        found.await.inspect_err(|e| tracing::warn!(run = %run_id, error = %e, "cannot read a run's events"))
    }

    /// Where runs of other replicas are read, when runs are shared.
    pub(crate) fn shared_runs(&self) -> Option<&SharedRuns> {
        self.0.shared.as_deref()
    }

    /// The checkpoints of `who`'s conversation `id`, oldest first: what each step of
    /// its runs recorded (for an inspector; docs/service.md).
    ///
    /// # Errors
    /// `NotFound` when it is not theirs; `Internal` when the store fails.
    pub async fn checkpoints(&self, who: &Principal, id: ConversationId) -> Result<Vec<CheckpointMeta>, ChatError> {
        let (agent, thread) = self.conversation_thread(who, id).await?;
        agent.agent.history(&thread).await.map_err(internal)
    }

    /// The runs `who`'s conversation `id` records in its checkpoints, oldest first, with the
    /// conversation's agent: what every replica can tell of its runs, however long ago they
    /// ran (a replica's own logs keep only its runs of the last few minutes).
    ///
    /// # Errors
    /// As [`ChatService::checkpoints`].
    pub async fn recorded_runs(
        &self,
        who: &Principal,
        id: ConversationId,
    ) -> Result<(String, Vec<toolgraph_graph::RecordedRun>), ChatError> {
        let (name, agent, thread) = self.named_thread_of(who.ids(), id.0).await?;
        let runs = agent.agent.recorded_runs(&thread).await.map_err(internal)?;
        Ok((name.to_owned(), runs))
    }

    /// [`ChatService::checkpoints`] from checkpoint `from` on: the last few, without reading
    /// the whole history.
    ///
    /// # Errors
    /// As [`ChatService::checkpoints`].
    pub async fn checkpoints_from(
        &self,
        who: &Principal,
        id: ConversationId,
        from: u64,
    ) -> Result<Vec<CheckpointMeta>, ChatError> {
        let (agent, thread) = self.conversation_thread(who, id).await?;
        let records = agent.agent.checkpointer().load_from(&thread, from).await.map_err(internal)?;
        Ok(records.iter().map(CheckpointMeta::from).collect())
    }

    /// `who`'s conversations, newest first, at most `limit` (capped at
    /// [`MAX_LISTED_CONVERSATIONS`]).
    ///
    /// # Errors
    /// `Store` when the store fails.
    pub async fn list_conversations(
        &self,
        who: &Principal,
        limit: usize,
    ) -> Result<Vec<toolgraph_conversations::ConversationSummary>, ChatError> {
        let (tenant, user) = who.ids();
        Ok(self.0.store.list_conversations(tenant, user, limit.min(MAX_LISTED_CONVERSATIONS)).await?)
    }

    /// The newest of `who`'s conversations with `agent` whose person's messages are
    /// `asked`, in order — for a client that sends the whole conversation with every message
    /// and no id, as OpenAI's chat completions do. Only the newest [`RECOGNISED_AMONG`] are
    /// looked at, and only those whose title is the first of `asked`.
    ///
    /// # Errors
    /// `Store` when the store fails.
    pub async fn conversation_asking(
        &self,
        who: &Principal,
        agent: &str,
        asked: &[String],
    ) -> Result<Option<ConversationId>, ChatError> {
        let (tenant, user) = who.ids();
        let Some(first) = asked.first() else { return Ok(None) };
        let title: String = first.chars().take(toolgraph_conversations::SUMMARY_TITLE_CHARS).collect();
        for summary in self.0.store.list_conversations(tenant, user, RECOGNISED_AMONG).await? {
            if summary.agent != agent || summary.title != title {
                continue;
            }
            let messages = self.0.store.messages(summary.id).await?;
            let said = messages.iter().filter(|m| m.role == toolgraph_conversations::Role::User).map(|m| &m.content);
            if said.eq(asked.iter()) {
                return Ok(Some(ConversationId(summary.id)));
            }
        }
        Ok(None)
    }

    /// Forks `who`'s conversation `id` at checkpoint `seq` into a new conversation of theirs with the same agent: the checkpoints up to `seq` and the messages they hold,
    /// ready for the next message (a turn cut at `seq` mid-run is closed there). The original is
    /// left as it is. Returns the new conversation's id.
    ///
    /// # Errors
    /// `NotFound` when the conversation is not theirs or has no such checkpoint; `Conflict` for
    /// a pause waiting for decisions (its pending actions belong to the original); `Store`,
    /// `Internal`.
    pub async fn fork(&self, who: &Principal, id: ConversationId, seq: u64) -> Result<ConversationId, ChatError> {
        let (tenant, user) = who.ids();
        let conv = self.0.store.conversation(tenant, user, id.0).await?.ok_or(ChatError::NotFound)?;
        let (agent, thread) = self.conversation_thread(who, id).await?;
        let head = match agent.agent.state_at(&thread, seq).await {
            Ok(head) => head,
            Err(GraphError::NotFound { .. }) => return Err(ChatError::NotFound),
            Err(e) => return Err(internal(e)),
        };
        // A pause at the thread's head waits, decided or not (a resume cancelled before its
        // first step leaves its decisions to apply): its pending actions belong to the original.
        let at_head = || async {
            let head = agent.agent.checkpointer().head(&thread).await.map_err(internal)?;
            Ok::<_, ChatError>(head.is_some_and(|(last, _)| last == seq))
        };
        if head.undecided() || (!head.pending.is_empty() && at_head().await?) {
            return Err(ChatError::Conflict(format!(
                "checkpoint {seq} is a pause waiting for decisions; fork from a checkpoint before or after it"
            )));
        }
        let records = agent.agent.checkpointer().load(&thread, Some(seq)).await.map_err(internal)?;
        let new_id = self.0.store.create_conversation(tenant, user, &conv.agent).await?;
        let copied = async {
            // The messages first: a checkpoint never refers to messages the store lacks.
            for record in &records {
                for (role, content) in agent.agent.project(new_id, record).messages {
                    self.0.store.add_message(new_id, role, &content).await?;
                }
            }
            let to = ConversationThread { tenant, conversation: new_id }.thread_id();
            agent.agent.fork(&thread, seq, &to).await.map_err(internal)
        };
        if let Err(e) = copied.await {
            // Nothing half-made stays: the new conversation goes with what it got.
            let _ = self.delete_conversation(who, ConversationId(new_id)).await;
            return Err(e);
        }
        Ok(ConversationId(new_id))
    }

    /// Rolls back run `run` of `who`'s conversation `id`: the checkpoints it wrote, the
    /// messages and pending actions they put in the conversation, and this replica's log of it
    /// go, as if it had never run (docs/langgraph.md, "Runs"). What the run did outside the
    /// conversation (a write tool that ran, a remembered fact, the tokens it used) stays.
    /// Returns how many checkpoints went.
    ///
    /// # Errors
    /// `Busy` while a run holds the conversation (cancel it and wait first); `NotFound` for a
    /// conversation not theirs or a run that wrote nothing in it; `Conflict` for a run that is
    /// not the conversation's last, one that resumed a pause (its decisions stay recorded), one
    /// whose first checkpoint retention folded older ones into, or a conversation whose last
    /// messages are not what the run wrote; `Store`, `Internal`.
    pub async fn roll_back(&self, who: &Principal, id: ConversationId, run: &RunId) -> Result<u64, ChatError> {
        if !self.keeps_threads() {
            return Err(ChatError::Conflict(
                "this store's conversations are the backend's: a run cannot be rolled back".into(),
            ));
        }
        let (agent, thread) = self.conversation_thread(who, id).await?;
        // Held for the time it takes: no turn starts on what is being taken back.
        let claim = TurnClaim { run_id: format!("rollback-{}", uuid::Uuid::now_v7()), ..self.claim() };
        if !self.0.store.begin_turn(id.0, &claim).await? {
            return Err(ChatError::Busy);
        }
        let rolled = async {
            let records = agent.agent.checkpointer().load(&thread, None).await.map_err(internal)?;
            let first = records.iter().position(|r| r.run_id == run.as_str()).ok_or(ChatError::NotFound)?;
            let refuse = |why: &str| Err(ChatError::Conflict(format!("run {run} cannot be rolled back: {why}")));
            if records[first..].iter().any(|r| r.run_id != run.as_str()) {
                return refuse("it is not the last run of its thread");
            }
            if records[first].kind == RecordKind::Decision {
                return refuse("it resumed a pause, whose decisions stay recorded (cancel it instead)");
            }
            if first == 0 && records[0].seq > 1 {
                return refuse("retention folded the thread's older checkpoints into this run's");
            }
            // What the run wrote, in the order the projection wrote it: each record's messages,
            // then its pending actions' messages.
            let mut wrote: Vec<(Role, String)> = Vec::new();
            for record in &records[first..] {
                let projected = agent.agent.project(id.0, record);
                wrote.extend(projected.messages);
                wrote.extend(projected.pending.into_iter().map(|p| (Role::Pending, p.description)));
            }
            let stored = self.0.store.messages(id.0).await?;
            let Some(n) = tail_written(&stored, &wrote) else {
                return refuse("the conversation's last messages are not the ones it wrote");
            };
            let keep = records[first].seq.saturating_sub(1);
            // The checkpoints first: a failure after them leaves messages a retry will not
            // find (404), never deletes messages another run wrote.
            let gone = agent.agent.checkpointer().truncate_thread(&thread, keep).await.map_err(internal)?;
            self.0.store.delete_last_messages(id.0, n).await?;
            Ok(gone)
        }
        .await;
        self.release(id.0, &claim.run_id).await;
        let gone = rolled?;
        self.0.runs.forget_run(run.as_str());
        Ok(gone)
    }

    /// The agents served, by name, with the version of its definition each runs (and a newer
    /// one that failed its checks); and the default agent's name.
    pub fn agents(&self) -> (Vec<(String, Revision)>, &str) {
        let list = self.0.agents.iter().map(|(name, a)| (name.clone(), a.agent.revision())).collect();
        (list, &self.0.default_agent)
    }

    /// The shape of the agent `name`'s graph, if it is served.
    pub fn agent_shape(&self, name: &str) -> Option<toolgraph_graph::GraphShape> {
        self.0.agents.get(name).map(|a| a.agent.shape())
    }

    /// The graph of the agent `name` as an SVG picture (its nodes carry `data-node`), if it is
    /// served.
    pub fn agent_graph_svg(&self, name: &str) -> Option<String> {
        self.0.agents.get(name).map(|a| a.agent.shape().to_svg())
    }

    /// The state of `who`'s conversation `id` as checkpoint `seq` left it: the agent's state,
    /// the node that runs next, the pause's interrupts and decisions.
    ///
    /// # Errors
    /// `NotFound` when the conversation is not theirs or has no such checkpoint; `Internal`.
    pub async fn checkpoint(&self, who: &Principal, id: ConversationId, seq: u64) -> Result<CheckpointView, ChatError> {
        let (agent, thread) = self.conversation_thread(who, id).await?;
        match agent.agent.state_at(&thread, seq).await {
            Ok(at) => Ok(CheckpointView { conversation: id, at }),
            Err(GraphError::NotFound { .. }) => Err(ChatError::NotFound),
            Err(e) => Err(internal(e)),
        }
    }

    /// [`ChatService::checkpoint`] of each of `seqs`, in the same order, the conversation read
    /// once (a history of states).
    ///
    /// # Errors
    /// As [`ChatService::checkpoint`].
    pub async fn checkpoints_at(
        &self,
        who: &Principal,
        id: ConversationId,
        seqs: &[u64],
    ) -> Result<Vec<CheckpointView>, ChatError> {
        let (agent, thread) = self.conversation_thread(who, id).await?;
        match agent.agent.states_at(&thread, seqs).await {
            Ok(states) => Ok(states.into_iter().map(|at| CheckpointView { conversation: id, at }).collect()),
            Err(GraphError::NotFound { .. }) => Err(ChatError::NotFound),
            Err(e) => Err(internal(e)),
        }
    }

    /// The served agent and checkpoint thread of `who`'s conversation `id`.
    async fn conversation_thread(
        &self,
        who: &Principal,
        id: ConversationId,
    ) -> Result<(&ServedAgent, toolgraph_graph::ThreadId), ChatError> {
        self.thread_of(who.ids(), id.0).await
    }

    /// [`ChatService::conversation_thread`] by the store's ids: (tenant, user), conversation.
    async fn thread_of(
        &self,
        (tenant, user): (i64, i64),
        id: i64,
    ) -> Result<(&ServedAgent, toolgraph_graph::ThreadId), ChatError> {
        self.named_thread_of((tenant, user), id).await.map(|(_, agent, thread)| (agent, thread))
    }

    /// [`ChatService::thread_of`], with the agent's name.
    async fn named_thread_of(
        &self,
        (tenant, user): (i64, i64),
        id: i64,
    ) -> Result<(&str, &ServedAgent, toolgraph_graph::ThreadId), ChatError> {
        let conv = self.0.store.conversation(tenant, user, id).await?.ok_or(ChatError::NotFound)?;
        let (name, agent) = self
            .0
            .agents
            .get_key_value(&conv.agent)
            .ok_or_else(|| ChatError::Internal(format!("agent '{}' is gone", conv.agent)))?;
        Ok((name, agent, ConversationThread { tenant, conversation: id }.thread_id()))
    }

    /// Whether the conversation store keeps LangGraph's threads (a backend's does not).
    pub fn keeps_threads(&self) -> bool {
        self.0.store.keeps_threads()
    }

    /// Keeps a new LangGraph thread `id` of `who` with `metadata`: the thread, or `None` when
    /// its id is taken (docs/langgraph.md).
    ///
    /// # Errors
    /// `Store` (also for a store that keeps no threads).
    pub async fn create_thread(
        &self,
        who: &Principal,
        id: String,
        metadata: Map<String, Value>,
    ) -> Result<Option<toolgraph_conversations::Thread>, ChatError> {
        let (tenant, user) = who.ids();
        let thread = toolgraph_conversations::Thread::new(id, tenant, user, metadata);
        Ok(self.0.store.create_thread(&thread).await?.then_some(thread))
    }

    /// `who`'s thread `id`.
    ///
    /// # Errors
    /// `NotFound` when it is not theirs; `Store`.
    pub async fn thread(&self, who: &Principal, id: &str) -> Result<toolgraph_conversations::Thread, ChatError> {
        let (tenant, user) = who.ids();
        self.0.store.thread(tenant, user, id).await?.ok_or(ChatError::NotFound)
    }

    /// `who`'s threads, the latest changed first.
    ///
    /// # Errors
    /// `Store`.
    pub async fn threads(&self, who: &Principal) -> Result<Vec<toolgraph_conversations::Thread>, ChatError> {
        let (tenant, user) = who.ids();
        Ok(self.0.store.threads(tenant, user).await?)
    }

    /// Replaces thread `id`'s metadata (when given) and binds its conversation (when given and
    /// it has none).
    ///
    /// # Errors
    /// `NotFound` when it is not theirs; `Store`.
    pub async fn update_thread(
        &self,
        who: &Principal,
        id: &str,
        metadata: Option<&Map<String, Value>>,
        conversation: Option<ConversationId>,
    ) -> Result<(), ChatError> {
        let (tenant, user) = who.ids();
        if self.0.store.update_thread(tenant, user, id, metadata, conversation.map(i64::from)).await? {
            Ok(())
        } else {
            Err(ChatError::NotFound)
        }
    }

    /// Whether a run holds `who`'s conversation `id` now, on this replica or another (its last
    /// checkpoint is a run's input, step or decisions with a node still to run — a pause whose
    /// decisions are not all in yet reads the same, and is told apart by what it awaits): one
    /// small read.
    ///
    /// # Errors
    /// `NotFound` when it is not theirs; `Internal`.
    pub async fn run_in_progress(&self, who: &Principal, id: ConversationId) -> Result<bool, ChatError> {
        if self.running_run(who, id).is_some() {
            return Ok(true);
        }
        let (agent, thread) = self.conversation_thread(who, id).await?;
        let store = agent.agent.checkpointer();
        let Some((seq, _)) = store.head(&thread).await.map_err(internal)? else { return Ok(false) };
        let last = store.load_from(&thread, seq).await.map_err(internal)?.pop();
        // A decision record with a reason marks a resume that ended before its first step
        // (cancelled, dead, refused by the store): the pause waits again.
        Ok(last.is_some_and(|r| {
            r.next.is_some()
                && matches!(r.kind, RecordKind::Input | RecordKind::Step | RecordKind::Decision)
                && r.reason.is_none()
        }))
    }

    /// Moves `who`'s thread `id` from conversation `from` to `to` (a fork of it), if it is still
    /// bound to `from`.
    ///
    /// # Errors
    /// `Conflict` when it is no longer bound to `from` (another request moved it first) or is
    /// not theirs; `Store`.
    pub async fn rebind_thread(
        &self,
        who: &Principal,
        id: &str,
        from: ConversationId,
        to: ConversationId,
    ) -> Result<(), ChatError> {
        let (tenant, user) = who.ids();
        if self.0.store.rebind_thread(tenant, user, id, from.0, to.0).await? {
            Ok(())
        } else {
            Err(ChatError::Conflict(format!("thread '{id}' moved to another conversation meanwhile")))
        }
    }

    /// Writes `values` into `who`'s conversation `id` from outside a run, as node `as_node` of
    /// its agent had (docs/langgraph.md, "Threads"): a checkpoint, committed with the messages it
    /// adds to the conversation. Returns its number.
    ///
    /// # Errors
    /// `NotFound` when it is not theirs; `Invalid` for a node the agent's graph lacks or values
    /// its state does not take; `Busy` while a run holds it (on any replica); `Conflict` while
    /// it waits for decisions; `Internal`.
    pub async fn update_state(
        &self,
        who: &Principal,
        id: ConversationId,
        values: &Map<String, Value>,
        as_node: Option<&str>,
    ) -> Result<u64, ChatError> {
        if self.running_run(who, id).is_some() {
            return Err(ChatError::Busy);
        }
        let (agent, thread) = self.conversation_thread(who, id).await?;
        // Held while it writes, as a turn is: no turn starts and no rollback takes back what is
        // being written, on any replica. In a task of its own, so a request dropped meanwhile
        // does not leave the conversation held until its lease runs out.
        let claim = TurnClaim { run_id: format!("update-{}", uuid::Uuid::now_v7()), ..self.claim() };
        let (service, writer, values, as_node) =
            (self.clone(), Arc::clone(&agent.agent), values.clone(), as_node.map(str::to_owned));
        let written = tokio::spawn(async move {
            if !service.0.store.begin_turn(id.0, &claim).await? {
                return Err(ChatError::Busy);
            }
            let written = writer.update_state(&thread, &values, as_node.as_deref()).await;
            service.release(id.0, &claim.run_id).await;
            Ok(written)
        })
        .await
        .map_err(internal)??;
        match written {
            Ok(seq) => Ok(seq),
            Err(GraphError::UnknownNode(node)) => Err(ChatError::Invalid {
                field: "as_node".into(),
                message: format!(
                    "the agent's graph has no node `{}`: {}",
                    crate::error::echoed(&node),
                    node_names(&agent.agent.shape())
                ),
            }),
            Err(GraphError::InvalidUpdate(message)) => Err(ChatError::Invalid { field: "values".into(), message }),
            Err(GraphError::AwaitingDecision { .. }) => Err(ChatError::Conflict(
                "the conversation waits for decisions: decide them (or cancel the run) before updating its state"
                    .into(),
            )),
            Err(GraphError::ConcurrentRun { .. }) => Err(ChatError::Busy),
            Err(e) => Err(internal(e)),
        }
    }

    /// Deletes `who`'s thread `id` with its conversation (and those it left for an earlier
    /// checkpoint), checkpoints and runs (as
    /// [`ChatService::delete_conversation`] does, a turn running on it included).
    ///
    /// # Errors
    /// `NotFound` when it is not theirs; `Store`, `Internal`.
    pub async fn delete_thread(&self, who: &Principal, id: &str) -> Result<(), ChatError> {
        let thread = self.thread(who, id).await?;
        let (tenant, user) = who.ids();
        // The branches it left for an earlier checkpoint first: they are the thread's too.
        for branch in self.0.store.thread_branches(tenant, user, id).await? {
            match self.delete_conversation(who, ConversationId(branch)).await {
                Ok(()) | Err(ChatError::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
        if let Some(conversation) = thread.conversation {
            match self.delete_conversation(who, ConversationId(conversation)).await {
                // Its conversation is gone already (deleted on the academy routes).
                Ok(()) | Err(ChatError::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
        self.0.store.delete_thread(tenant, user, id).await?;
        Ok(())
    }

    /// The last checkpoint of `who`'s conversation `id`, as [`ChatService::checkpoint`] shows
    /// it; `None` before its first turn.
    ///
    /// # Errors
    /// `NotFound` when it is not theirs; `Internal`.
    pub async fn head_checkpoint(
        &self,
        who: &Principal,
        id: ConversationId,
    ) -> Result<Option<CheckpointView>, ChatError> {
        let (agent, thread) = self.conversation_thread(who, id).await?;
        let at = agent.agent.current_state(&thread).await.map_err(internal)?;
        Ok(at.map(|at| CheckpointView { conversation: id, at }))
    }

    /// The agent `who`'s conversation `id` talks to.
    ///
    /// # Errors
    /// `NotFound` when it is not theirs; `Store`.
    pub async fn conversation_agent(&self, who: &Principal, id: ConversationId) -> Result<String, ChatError> {
        let (tenant, user) = who.ids();
        Ok(self.0.store.conversation(tenant, user, id.0).await?.ok_or(ChatError::NotFound)?.agent)
    }

    /// The actions `who`'s conversation `id` waits on: its paused run's undecided
    /// approvals and questions, in message order (all of them when they are decided and no
    /// run applied them: the same decisions resume the pause).
    ///
    /// # Errors
    /// `NotFound` when it is not theirs; `Store`.
    pub async fn awaiting(&self, who: &Principal, id: ConversationId) -> Result<Vec<PendingActionDto>, ChatError> {
        let (agent, thread) = self.conversation_thread(who, id).await?;
        Ok(self.undecided_actions(agent, &thread, id.0).await)
    }

    /// Deletes `who`'s conversation `id` and its checkpoints.
    ///
    /// # Errors
    /// `NotFound` when it is not theirs; `Store`; `Internal` when the checkpoints cannot go.
    pub async fn delete_conversation(&self, who: &Principal, id: ConversationId) -> Result<(), ChatError> {
        let (tenant, user) = who.ids();
        if !self.0.store.delete_conversation(tenant, user, id.0).await? {
            return Err(ChatError::NotFound);
        }
        self.delete_checkpoints(tenant, &[id.0]).await?;
        self.delete_attachments(tenant, vec![id.0]).await?;
        self.delete_runs(RunScope::Conversation { tenant, conversation: id.0 }).await
    }

    /// Deletes `who`'s conversations and their checkpoints (the person's data); how many there
    /// were.
    ///
    /// # Errors
    /// `Store`; `Internal` when the checkpoints cannot go.
    pub async fn delete_user(&self, who: &Principal) -> Result<usize, ChatError> {
        let (tenant, user) = who.ids();
        let ids = self.0.store.delete_user(tenant, user).await?;
        self.delete_checkpoints(tenant, &ids).await?;
        self.delete_attachments(tenant, ids.clone()).await?;
        self.delete_runs(RunScope::User { tenant, user }).await?;
        Ok(ids.len())
    }

    /// Deletes a tenant's conversations and checkpoints; how many conversations there were.
    ///
    /// # Errors
    /// `Store`; `Internal` when the checkpoints cannot go.
    pub async fn delete_tenant(&self, tenant: &AdmittedTenant) -> Result<usize, ChatError> {
        let tenant = tenant.id().0;
        let ids = self.0.store.delete_tenant(tenant).await?;
        // A conversation's thread is namespaced by its tenant (ConversationThread).
        self.0.checkpointer.delete_namespace(&tenant.to_string()).await.map_err(internal)?;
        self.delete_tenant_attachments(tenant).await?;
        self.delete_runs(RunScope::Tenant(tenant)).await?;
        Ok(ids.len())
    }

    /// What the runs in `scope` streamed, gone with their data: this replica's logs and, with
    /// replicas, the shared store's frames.
    async fn delete_runs(&self, scope: RunScope) -> Result<(), ChatError> {
        self.0.runs.forget(scope);
        if let Some(shared) = &self.0.shared {
            shared.delete_runs(scope).await.map_err(ChatError::Internal)?;
        }
        Ok(())
    }

    async fn delete_checkpoints(&self, tenant: i64, conversations: &[i64]) -> Result<(), ChatError> {
        for &conversation in conversations {
            let thread = ConversationThread { tenant, conversation }.thread_id();
            self.0.checkpointer.delete_thread(&thread).await.map_err(internal)?;
        }
        Ok(())
    }

    /// Releases `conversation` from run `run_id` now, or — the store is down — as soon as the
    /// store is back, rather than when the lease runs out.
    pub(crate) async fn release(&self, conversation: i64, run_id: &str) {
        if let Err(e) = self.0.store.end_turn(conversation, run_id).await {
            tracing::warn!(conversation, error = %e, "cannot release the conversation; retrying in the background");
            self.release_later(conversation, run_id.to_owned(), self.0.options.turn_lease);
        }
    }

    /// Releases `conversation` from run `run_id` once the store lets it: retried every 500 ms
    /// for at most `lease` (by then the lease has run out and anyone may take it anyway), or
    /// until the service shuts down.
    fn release_later(&self, conversation: i64, run_id: String, lease: Duration) {
        let (store, shutdown) = (Arc::clone(&self.0.store), self.0.shutdown.clone());
        self.0.tasks.spawn(async move {
            let deadline = tokio::time::Instant::now() + lease;
            while tokio::time::Instant::now() < deadline {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
                if store.end_turn(conversation, &run_id).await.is_ok() {
                    tracing::info!(conversation, run = %run_id, "released the conversation once the store was back");
                    return;
                }
            }
        });
    }

    /// The conversation store.
    pub(crate) fn store(&self) -> &dyn ConversationStore {
        self.0.store.as_ref()
    }

    /// Refuses new runs, cancels the ones in flight (each records why and releases its
    /// conversation) and waits for them to end.
    pub async fn shutdown(&self) {
        self.0.shutdown.cancel();
        self.0.tasks.close();
        self.0.tasks.wait().await;
        // The runs' last frames (their `error` on cancellation) reach the other replicas.
        if let Some(shared) = &self.0.shared {
            shared.stop();
            let relay = self.0.relay.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(relay) = relay
                && tokio::time::timeout(Duration::from_secs(6), relay).await.is_err()
            {
                tracing::warn!("publishing the last run events took over 6 s");
            }
        }
    }
}

/// The store's lookup of `who`'s pending action `message` of `conversation`.
fn lookup(who: &Principal, conversation: ConversationId, message: MessageId) -> PendingLookup {
    PendingLookup {
        tenant_id: who.tenant().0,
        user_id: who.user().0,
        conversation_id: conversation.0,
        message_id: message.0,
    }
}

fn internal(e: impl std::fmt::Display) -> ChatError {
    ChatError::Internal(e.to_string())
}

/// The nodes of `shape` a state update may name, for a refusal.
fn node_names(shape: &toolgraph_graph::GraphShape) -> String {
    let nodes: Vec<&str> = shape
        .nodes
        .iter()
        .map(String::as_str)
        .filter(|n| *n != toolgraph_graph::START && *n != toolgraph_graph::END)
        .collect();
    format!("its nodes are {}", nodes.join(", "))
}

#[cfg(test)]
mod slot_tests {
    use super::*;

    #[test]
    fn idle_tenants_are_dropped_and_busy_ones_kept() {
        let slots = Slots::<i64>::new();
        let held = slots.admit(&1, 2).unwrap();
        assert!(held.is_some());
        for id in 2..=(SLOTS_PRUNE_AT as i64 + 10) {
            drop(slots.admit(&id, 2).unwrap());
        }
        assert!(slots.len() < SLOTS_PRUNE_AT, "{} tenants kept", slots.len());
        // The busy tenant kept its count: one more fits, the next is refused.
        let second = slots.admit(&1, 2).unwrap();
        assert!(matches!(slots.admit(&1, 2), Err(ChatError::TooManyRuns { limit: 2 })));
        drop((held, second));
        assert!(slots.admit(&1, 2).unwrap().is_some());
        assert!(slots.admit(&5, 0).unwrap().is_none(), "no limit, no slot");
    }
}

#[cfg(test)]
mod rollback_tests {
    use super::*;
    use toolgraph_conversations::StoredMessage;

    fn stored(messages: &[(Role, &str)]) -> Vec<StoredMessage> {
        let each = messages.iter().enumerate();
        each.map(|(i, (role, content))| StoredMessage { id: i as i64 + 1, role: *role, content: (*content).into() })
            .collect()
    }

    #[test]
    fn a_runs_messages_are_found_at_the_end_with_the_services_fallback_or_not_at_all() {
        let wrote = [(Role::User, "loop".to_owned()), (Role::Tool, "{\"ok\":true}".to_owned())];
        let before = [(Role::User, "hola"), (Role::Assistant, "Hola.")];
        let mut messages = before.to_vec();
        messages.extend([(Role::User, "loop"), (Role::Tool, "{\"ok\":true}")]);
        assert_eq!(tail_written(&stored(&messages), &wrote), Some(2));
        // The fallback reply the service wrote after a run that hit its step limit goes too.
        messages.push((Role::Assistant, turn::RECURSION_FALLBACK));
        assert_eq!(tail_written(&stored(&messages), &wrote), Some(3));
        // Not what the run wrote (a message between, another order): nothing is deleted.
        let mut other = before.to_vec();
        other.extend([(Role::User, "loop"), (Role::Assistant, "x"), (Role::Tool, "{\"ok\":true}")]);
        assert_eq!(tail_written(&stored(&other), &wrote), None);
        assert_eq!(tail_written(&stored(&before), &wrote), None);
        assert_eq!(tail_written(&stored(&before), &[]), Some(0), "a run that wrote nothing");
    }
}
