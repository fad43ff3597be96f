//! What the OpenAPI 3.1 document of every HTTP route (`GET /openapi.json`, docs/api.md) says
//! beyond the handlers' own `#[utoipa::path]`s: its header, groups and callers, the refusals
//! every route shares, and the types that describe answers the handlers write as JSON of
//! LangGraph's, OpenAI's or the chat contract's shapes (the types of other crates that answers
//! carry describe themselves, behind those crates' `openapi` feature);
//! `crates/cli/tests/openapi.rs` has schemathesis check every answer against them. The
//! handlers use this module; it uses none of them ([`crate::routes`] assembles the document).

use std::collections::BTreeMap;
use utoipa::openapi::{ContentBuilder, RefOr, Response, ResponseBuilder};
use utoipa::{OpenApi, ToSchema};

/// Route groups, in the order docs/api.md describes them.
pub(crate) const CHAT: &str = "chat contract";
pub(crate) const LANGGRAPH: &str = "LangGraph";
pub(crate) const OPENAI: &str = "OpenAI";
pub(crate) const AGUI: &str = "AG-UI";
pub(crate) const MCP: &str = "MCP";
pub(crate) const SEARCH: &str = "search";
pub(crate) const OPS: &str = "operations";

/// What the document says before the routes: who asks, and how each group is reached.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "toolgraph",
        description = "Every HTTP route of `toolgraph serve`. Who asks: under `server.auth = \"api_key\"` \
            an `Authorization: Bearer` key with the tenant's `X-Tenant-Slug`; under `hmac` the chat \
            contract's signed requests; under `none` the tenant header alone. The LangGraph, OpenAI and \
            AG-UI doors and the store read the person from `X-Tenant-Id` (or the key's bound tenant) and \
            `X-User-Id`; the chat contract reads them from its bodies and queries. Refusals are \
            `{\"error\", \"field\"?}` (OpenAI's `{\"error\": {message, type, param, code}}` on `/v1`). \
            The guide is docs/api.md.",
    ),
    components(schemas(ErrorBody, OpenAiErrorBody, OpenAiErrorDetail, SearchFailure)),
    security(("bearer" = []), ("tenant" = [])),
    modifiers(&SecuritySchemes),
    tags(
        (name = "chat contract", description = "The academy-admin chat contract (docs/service.md)."),
        (name = "LangGraph", description = "LangGraph's Agent Server API: assistants, threads, runs, store (docs/langgraph.md)."),
        (name = "OpenAI", description = "OpenAI's chat completions, the agents as models (docs/openai.md)."),
        (name = "AG-UI", description = "An agent's AG-UI endpoint (docs/ag-ui.md)."),
        (name = "MCP", description = "The tools as an MCP server over streamable HTTP (docs/plugins.md)."),
        (name = "search", description = "The course tutor's retrieval contract (docs/retrieval.md)."),
        (name = "operations", description = "Liveness, readiness, metrics, this document."),
    )
)]
pub(crate) struct Base;

/// The ways a caller is known: a bearer key, the tenant's slug, and the person's ids.
struct SecuritySchemes;

impl utoipa::Modify for SecuritySchemes {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        let header =
            |name: &str, what: &str| SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(name, what)));
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("An API key of `server.api_keys` (under `server.auth = \"api_key\"`)."))
                    .build(),
            ),
        );
        components.add_security_scheme("tenant", header("X-Tenant-Slug", "The tenant that asks."));
        components.add_security_scheme(
            "tenantId",
            header("X-Tenant-Id", "The tenant's numeric id (not needed with a key bound to a tenant)."),
        );
        components.add_security_scheme("userId", header("X-User-Id", "The numeric id of the person asking."));
    }
}

/// The whole document: [`Base`] with `routes` (every route's path, as the routers were built),
/// each operation named after its method and path, and the header doors' callers described.
pub(crate) fn document(routes: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    let mut doc = Base::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_owned();
    doc.merge(routes);
    for (path, item) in doc.paths.paths.iter_mut() {
        let header_door = PERSON_FROM_HEADERS.iter().any(|door| path.starts_with(door));
        for (method, operation) in operations(item) {
            // The handlers' function names repeat across modules (`get`, `search`): the method
            // and the path are what is unique.
            operation.operation_id = Some(operation_id(method, path));
            if let Some(body) = operation.request_body.as_mut() {
                optional_body(body);
            }
            if header_door {
                operation.security = Some(header_door_callers());
            }
        }
    }
    doc
}

/// The routes that read the person asking from headers (`X-Tenant-Id`, `X-User-Id`).
const PERSON_FROM_HEADERS: [&str; 5] = ["/v1/chat/", "/ag-ui/", "/threads", "/runs", "/store/"];

/// `get_threads_thread_id`: an operation's id from its method and path.
fn operation_id(method: &str, path: &str) -> String {
    let words: Vec<&str> = path.split(|c: char| !c.is_ascii_alphanumeric()).filter(|w| !w.is_empty()).collect();
    // `/metrics/` is a route of its own beside `/metrics`.
    let slash = if path.len() > 1 && path.ends_with('/') { "_slash" } else { "" };
    format!("{method}_{}{slash}", words.join("_"))
}

/// A body described as `Option<T>` (`T` or `null`) is a body that may be left out, not one that
/// may be `null` (a handler reads an empty body as the defaults and refuses `null`): `T`, not
/// required.
fn optional_body(body: &mut utoipa::openapi::request_body::RequestBody) {
    use utoipa::openapi::{Required, schema::Schema};
    for content in body.content.values_mut() {
        let Some(RefOr::T(Schema::OneOf(one_of))) = &content.schema else { continue };
        let is_null =
            |s: &RefOr<Schema>| serde_json::to_value(s).is_ok_and(|v| v == serde_json::json!({ "type": "null" }));
        if let [a, b] = one_of.items.as_slice()
            && (is_null(a) || is_null(b))
        {
            let kept = if is_null(a) { b.clone() } else { a.clone() };
            content.schema = Some(kept);
            body.required = Some(Required::False);
        }
    }
}

/// Each operation of `item`, with its method's name.
fn operations(item: &mut utoipa::openapi::PathItem) -> Vec<(&'static str, &mut utoipa::openapi::path::Operation)> {
    [
        ("get", item.get.as_mut()),
        ("put", item.put.as_mut()),
        ("post", item.post.as_mut()),
        ("delete", item.delete.as_mut()),
        ("patch", item.patch.as_mut()),
    ]
    .into_iter()
    .filter_map(|(method, operation)| operation.map(|o| (method, o)))
    .collect()
}

/// Who may ask on a door that reads the person from headers: a key with the tenant's slug and
/// the person (a key bound to a tenant names its id), or under `none` the slug, the tenant's
/// id and the person.
fn header_door_callers() -> Vec<utoipa::openapi::security::SecurityRequirement> {
    use utoipa::openapi::security::SecurityRequirement;
    let none: [&str; 0] = [];
    vec![
        SecurityRequirement::new("bearer", none).add("tenant", none).add("userId", none),
        SecurityRequirement::new("tenant", none).add("tenantId", none).add("userId", none),
    ]
}

/// A refusal or failure: `{"error", "field"?, "pendingActions"?}`.
#[derive(ToSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)] // describes `ApiError`'s body
pub(crate) struct ErrorBody {
    /// What is wrong, for a person.
    error: String,
    /// The field or header it is about.
    field: Option<String>,
    /// The actions waiting for a decision, when that is why a turn was refused.
    pending_actions: Option<Vec<toolgraph_protocol::PendingAction>>,
}

/// `/v1`'s refusals, in OpenAI's shape.
#[derive(ToSchema)]
#[allow(dead_code)] // describes `OpenAiError`'s body
pub(crate) struct OpenAiErrorBody {
    error: OpenAiErrorDetail,
}

/// OpenAI's error object.
#[derive(ToSchema)]
#[allow(dead_code)] // a description of an answer: never built
pub(crate) struct OpenAiErrorDetail {
    message: String,
    /// `invalid_request_error`, `authentication_error`, `permission_error`, `not_found_error`,
    /// `conflict_error`, `rate_limit_error` or `server_error`.
    r#type: String,
    param: Option<String>,
    code: Option<String>,
    /// The actions waiting for a decision, when that is why a turn was refused.
    pending_actions: Option<Vec<toolgraph_protocol::PendingAction>>,
}

/// `/search`'s refusals and failures: `{"ok": false, "error"}`.
#[derive(ToSchema)]
#[allow(dead_code)] // a description of an answer: never built
pub(crate) struct SearchFailure {
    ok: bool,
    error: String,
}

/// A JSON response of any of `schemas` (components' names).
fn json_response(description: &str, schemas: &[&str]) -> RefOr<Response> {
    use utoipa::openapi::schema::{AnyOfBuilder, Ref, Schema};
    let schema: RefOr<Schema> = match schemas {
        [one] => Ref::from_schema_name(*one).into(),
        many => {
            Schema::AnyOf(many.iter().fold(AnyOfBuilder::new(), |b, name| b.item(Ref::from_schema_name(*name))).build())
                .into()
        }
    };
    ResponseBuilder::new()
        .description(description)
        .content("application/json", ContentBuilder::new().schema(Some(schema)).build())
        .build()
        .into()
}

/// The `4XX` and `5XX` answers of a route, in `schemas`.
fn ranges(schemas: &[&str]) -> BTreeMap<String, RefOr<Response>> {
    let refused = "Refused: a bad request (400/422), no caller (401), another tenant's (403), none such (404), a \
                   conflict (409), a body read too slowly (408), too large (413), over a limit (429).";
    let failed = "Failed: an internal error (500), a feature this server's store does not offer (501), a model or \
                  store that cannot be reached (502/503), a wait that ran out (504).";
    BTreeMap::from([
        ("4XX".to_owned(), json_response(refused, schemas)),
        ("5XX".to_owned(), json_response(failed, schemas)),
    ])
}

/// The refusals and failures of a route, as [`ErrorBody`].
pub(crate) struct Refusals;

impl utoipa::IntoResponses for Refusals {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        ranges(&["ErrorBody"])
    }
}

/// The refusals and failures of a `/v1` route, as [`OpenAiErrorBody`].
pub(crate) struct OpenAiRefusals;

impl utoipa::IntoResponses for OpenAiRefusals {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        ranges(&["OpenAiErrorBody"])
    }
}

/// `/search`'s refusals and failures: its own [`SearchFailure`], or [`ErrorBody`] when the
/// authentication in front of every route refuses.
pub(crate) struct SearchRefusals;

impl utoipa::IntoResponses for SearchRefusals {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        ranges(&["SearchFailure", "ErrorBody"])
    }
}

/// One server-sent event of a streaming route (each protocol's events are in its guide).
#[derive(ToSchema)]
#[allow(dead_code)] // a description of an answer: never built
pub(crate) struct SseEvent {
    /// The event's name (`token`, `values`, `RUN_STARTED` as `data.type` on AG-UI, …).
    event: Option<String>,
    /// Its payload: JSON, or `[DONE]` at the end of an OpenAI stream.
    data: String,
    /// Where a client resumes from (`Last-Event-ID`).
    id: Option<String>,
    /// How long a client waits before reconnecting, in ms.
    retry: Option<u64>,
}

/// `{"status"}` of `/health` and `/ready`.
#[derive(ToSchema)]
#[allow(dead_code)] // a description of an answer: never built
pub(crate) struct Status {
    /// `ok`; `ready` or `not ready`.
    status: String,
}

/// `POST /search`'s answer.
#[derive(ToSchema)]
#[allow(dead_code)] // a description of an answer: never built
pub(crate) struct SearchAnswer {
    ok: bool,
    query: String,
    total_results: u64,
    /// The passages found, best first, each with its document, score and text.
    results: Vec<serde_json::Value>,
}

/// An agent as LangGraph's `Assistant`.
#[derive(ToSchema)]
#[allow(dead_code)] // a description of an answer: never built
pub(crate) struct Assistant {
    assistant_id: String,
    graph_id: String,
    name: String,
    description: Option<String>,
    #[schema(value_type = Object)]
    config: serde_json::Value,
    #[schema(value_type = Object)]
    context: serde_json::Value,
    /// `graph_version`: the digest of the agent's declaration.
    #[schema(value_type = Object)]
    metadata: serde_json::Value,
    version: i64,
    created_at: String,
    updated_at: String,
}

/// An assistant's graph as LangGraph draws it.
#[derive(ToSchema)]
#[allow(dead_code)] // a description of an answer: never built
pub(crate) struct AssistantGraph {
    /// `{id, type: "schema" | "runnable", data}`.
    nodes: Vec<serde_json::Value>,
    /// `{source, target, conditional?}`.
    edges: Vec<serde_json::Value>,
}

/// What an assistant's turn takes and its state holds, as JSON Schemas.
#[derive(ToSchema)]
#[allow(dead_code)] // a description of an answer: never built
pub(crate) struct AssistantSchemas {
    graph_id: String,
    #[schema(value_type = Object)]
    input_schema: serde_json::Value,
    #[schema(value_type = Object)]
    output_schema: serde_json::Value,
    #[schema(value_type = Object)]
    state_schema: serde_json::Value,
    #[schema(value_type = Option<Object>)]
    config_schema: Option<serde_json::Value>,
    #[schema(value_type = Object)]
    context_schema: serde_json::Value,
}

/// Where a thread is.
#[derive(ToSchema)]
#[schema(rename_all = "lowercase")]
#[allow(dead_code)] // a description of an answer: never built
pub(crate) enum ThreadStatus {
    Idle,
    Busy,
    Interrupted,
}

/// A thread as LangGraph's `Thread`.
#[derive(ToSchema)]
#[allow(dead_code)] // a description of an answer: never built
pub(crate) struct Thread {
    thread_id: String,
    created_at: String,
    updated_at: String,
    /// When its state last changed (as `updated_at`).
    state_updated_at: String,
    #[schema(value_type = Object)]
    metadata: serde_json::Value,
    status: ThreadStatus,
    /// The agent's state: `messages` as LangChain's.
    #[schema(value_type = Object)]
    values: serde_json::Value,
    /// `{"TASK_ID": [interrupt]}` while it waits (the state's task that waits).
    #[schema(value_type = Object)]
    interrupts: serde_json::Value,
    #[schema(value_type = Object)]
    config: serde_json::Value,
    error: Option<serde_json::Value>,
}

/// A checkpoint of a thread as LangGraph's `ThreadState`.
#[derive(ToSchema)]
#[allow(dead_code)] // a description of an answer: never built
pub(crate) struct ThreadState {
    #[schema(value_type = Object)]
    values: serde_json::Value,
    /// The nodes that run next.
    next: Vec<String>,
    tasks: Vec<serde_json::Value>,
    interrupts: Option<Vec<serde_json::Value>>,
    #[schema(value_type = Object)]
    metadata: serde_json::Value,
    /// `{thread_id, checkpoint_ns, checkpoint_id}`.
    #[schema(value_type = Object)]
    checkpoint: serde_json::Value,
    #[schema(value_type = Option<Object>)]
    parent_checkpoint: Option<serde_json::Value>,
    /// `checkpoint.checkpoint_id`, as LangGraph's server also sends it.
    checkpoint_id: String,
    /// `parent_checkpoint.checkpoint_id`.
    parent_checkpoint_id: Option<String>,
    created_at: Option<String>,
}

/// `POST /threads/{thread_id}/state`'s answer: the checkpoint the update made.
#[derive(ToSchema)]
#[allow(dead_code)] // a description of an answer: never built
pub(crate) struct CheckpointRef {
    /// `{thread_id, checkpoint_ns, checkpoint_id}`.
    #[schema(value_type = Object)]
    checkpoint: serde_json::Value,
    /// The same, as LangGraph's server also sends it.
    #[schema(value_type = Object)]
    configurable: serde_json::Value,
    checkpoint_id: String,
}

/// A stream mode served.
#[derive(ToSchema)]
#[serde(rename_all = "kebab-case")]
#[allow(dead_code)] // a description of a request field: never built
pub(crate) enum StreamMode {
    Values,
    Updates,
    MessagesTuple,
    Custom,
    Debug,
    Tasks,
    Checkpoints,
}

/// A run's `stream_mode`: one mode, or several.
#[derive(ToSchema)]
#[serde(untagged)]
#[allow(dead_code)] // a description of a request field: never built
pub(crate) enum StreamModes {
    One(StreamMode),
    Many(Vec<StreamMode>),
}

/// What a run does when another run holds its thread (`multitask_strategy`).
#[derive(ToSchema)]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)] // a description of a request field: never built
pub(crate) enum MultitaskStrategy {
    Reject,
    Interrupt,
    Enqueue,
    Rollback,
}

/// What becomes of a stateless run's thread when the run ends (`on_completion`).
#[derive(ToSchema)]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)] // a description of a request field: never built
pub(crate) enum OnCompletion {
    Delete,
    Keep,
}

/// What creating a thread whose id is taken does (`if_exists`).
#[derive(ToSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)] // a description of a request field: never built
pub(crate) enum IfExists {
    Raise,
    DoNothing,
}

/// A run's outcome.
#[derive(ToSchema)]
#[schema(rename_all = "lowercase")]
#[allow(dead_code)] // a description of an answer: never built
pub(crate) enum RunStatus {
    Running,
    Success,
    Error,
    Interrupted,
}

/// A run as LangGraph's `Run`.
#[derive(ToSchema)]
#[allow(dead_code)] // a description of an answer: never built
pub(crate) struct Run {
    run_id: String,
    thread_id: String,
    assistant_id: String,
    status: RunStatus,
    #[schema(value_type = Object)]
    metadata: serde_json::Value,
    /// `reject`, `interrupt`, `enqueue` or `rollback`.
    multitask_strategy: String,
    created_at: String,
    updated_at: String,
}

/// A store item as LangGraph's `Item` (`score` on a search's).
#[derive(ToSchema)]
#[allow(dead_code)] // a description of an answer: never built
pub(crate) struct Item {
    namespace: Vec<String>,
    key: String,
    #[schema(value_type = Object)]
    value: serde_json::Value,
    created_at: String,
    updated_at: String,
    /// How well it matches a search's `query` (`null` without one).
    score: Option<f64>,
}

/// `POST /store/items/search`.
#[derive(ToSchema)]
#[allow(dead_code)] // a description of an answer: never built
pub(crate) struct ItemList {
    items: Vec<Item>,
}

/// `POST /store/namespaces`.
#[derive(ToSchema)]
#[allow(dead_code)] // a description of an answer: never built
pub(crate) struct NamespaceList {
    namespaces: Vec<Vec<String>>,
}

/// An agent as OpenAI's `Model`.
#[derive(ToSchema)]
#[allow(dead_code)] // a description of an answer: never built
pub(crate) struct Model {
    id: String,
    object: String,
    created: i64,
    owned_by: String,
}

/// `GET /v1/models`.
#[derive(ToSchema)]
#[allow(dead_code)] // a description of an answer: never built
pub(crate) struct ModelList {
    object: String,
    data: Vec<Model>,
}

/// A turn as OpenAI's `chat.completion`, with the extensions that continue it.
#[derive(ToSchema)]
#[allow(dead_code)] // a description of an answer: never built
pub(crate) struct ChatCompletion {
    id: String,
    object: String,
    created: u64,
    model: String,
    /// One choice: `{index, message: {role, content}, finish_reason}`.
    choices: Vec<serde_json::Value>,
    /// The tokens of the turn's model calls, as the model reported them.
    #[schema(value_type = Option<Object>)]
    usage: Option<serde_json::Value>,
    /// Extension: the conversation to continue.
    conversation_id: Option<i64>,
    /// Extension: the reply's message.
    message_id: Option<i64>,
    /// Extension: the actions waiting for a decision.
    pending_actions: Vec<toolgraph_protocol::PendingAction>,
}
