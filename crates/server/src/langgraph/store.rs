//! LangGraph's store (docs/langgraph.md, "Store"): put, get, search, delete and list the
//! namespaces of items, with a time to live in minutes. The store is the asking person's own
//! (tenant and user, like their threads), the same one their agents' memory reads
//! (docs/memory.md).
//!
//! Owns: the shapes LangGraph's SDKs send and read. The items are the
//! [`ChatService`](crate::ChatService)'s.

use super::threads::{Asker, rfc3339};
use crate::AppState;
use crate::error::{ApiError, ChatError};
use crate::extract::{QueryOf, json_body};
use crate::openapi::{Item, ItemList, LANGGRAPH, NamespaceList, Refusals};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use std::time::Duration;
use toolgraph_conversations::MemoryItem;
use toolgraph_conversations::items::{IndexFields, ItemSearch, NamespaceListing};

/// Most items or namespaces one call answers.
const MAX_LIMIT: usize = 1_000;

/// An item as LangGraph's `Item` (and `SearchItem`, with its score).
pub(crate) fn shape(item: &MemoryItem, score: Option<Option<f64>>) -> Value {
    let mut v = json!({
        "namespace": item.namespace,
        "key": item.key,
        "value": item.value,
        "created_at": rfc3339(item.created_at_ms),
        "updated_at": rfc3339(item.updated_at_ms),
    });
    if let (Some(score), Some(map)) = (score, v.as_object_mut()) {
        map.insert("score".into(), json!(score));
    }
    v
}

fn bounded_limit(limit: usize) -> Result<usize, ApiError> {
    if limit == 0 || limit > MAX_LIMIT {
        return Err(ApiError::field(
            StatusCode::UNPROCESSABLE_ENTITY,
            "limit",
            format!("{limit}: between 1 and {MAX_LIMIT}"),
        ));
    }
    Ok(limit)
}

/// `PUT /store/items`: what it reads.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = ItemPut)]
#[schema(example = json!({"namespace": ["prefs"], "key": "lang", "value": {"text": "Prefers answers in Spanish"}}))]
struct Put {
    namespace: Vec<String>,
    key: String,
    #[schema(value_type = Object)]
    value: Map<String, Value>,
    /// Minutes the item lives after its last write or refreshing read.
    #[serde(default)]
    #[schema(exclusive_minimum = 0, maximum = 52_560_000)]
    ttl: Option<f64>,
    /// What of the value is embedded when items are searched by meaning: `false` (nothing),
    /// or a list of top-level fields (`$`: all of it); by default its `text`, or all of it.
    #[serde(default)]
    index: Option<Value>,
}

/// A put's `index`, as LangGraph's SDKs send it.
fn index_fields(index: Option<Value>) -> Result<IndexFields, ApiError> {
    let invalid = |why: &str| ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, "index", why.to_owned());
    match index {
        None | Some(Value::Null) => Ok(IndexFields::Text),
        Some(Value::Bool(false)) => Ok(IndexFields::Off),
        Some(Value::Array(fields)) => {
            let names: Option<Vec<String>> = fields.iter().map(|f| f.as_str().map(str::to_owned)).collect();
            match names {
                Some(names) if names.is_empty() => Ok(IndexFields::Off),
                Some(names) if names.iter().all(|n| !n.is_empty() && n.chars().count() <= 256) => {
                    Ok(IndexFields::Only(names))
                }
                _ => Err(invalid("a list of field names (1 to 256 characters each)")),
            }
        }
        Some(_) => Err(invalid("false, or a list of field names")),
    }
}

/// `PUT /store/items`.
#[utoipa::path(put, path = "/store/items", tag = LANGGRAPH, request_body = Put,
    responses((status = 204, description = "Kept."), Refusals))]
pub(crate) async fn put(State(app): State<AppState>, Asker(who): Asker, body: Bytes) -> Result<Response, ApiError> {
    let put: Put = json_body(&body)?;
    let ttl = match put.ttl {
        None => None,
        Some(m) if m.is_finite() && m > 0.0 && m <= 525_600.0 * 100.0 => Some(Duration::from_secs_f64(m * 60.0)),
        Some(m) => {
            return Err(ApiError::field(
                StatusCode::UNPROCESSABLE_ENTITY,
                "ttl",
                format!(
                    "{m}: minutes, more than 0 and at most 52,560,000 (100 years; leave it out for an item that never expires)"
                ),
            ));
        }
    };
    let fields = index_fields(put.index)?;
    app.chat().put_item(&who.principal, put.namespace, put.key, put.value, ttl, &fields).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /store/items`: the namespace with its labels joined by `.`, as the SDKs send it.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct Get {
    /// The namespace's labels joined by `.`.
    #[serde(default)]
    #[param(example = "prefs")]
    namespace: String,
    #[param(example = "lang")]
    key: String,
    #[serde(default)]
    refresh_ttl: Option<bool>,
}

fn labels(joined: &str) -> Vec<String> {
    if joined.is_empty() { Vec::new() } else { joined.split('.').map(str::to_owned).collect() }
}

/// `GET /store/items`.
#[utoipa::path(get, path = "/store/items", tag = LANGGRAPH, params(Get),
    responses((status = 200, description = "The item.", body = Item), Refusals))]
pub(crate) async fn get(
    State(app): State<AppState>,
    Asker(who): Asker,
    QueryOf(q): QueryOf<Get>,
) -> Result<Response, ApiError> {
    let namespace = labels(&q.namespace);
    match app.chat().item(&who.principal, &namespace, &q.key, q.refresh_ttl.unwrap_or(true)).await {
        Ok(item) => Ok(axum::Json(shape(&item, None)).into_response()),
        Err(ChatError::NotFound) => Err(ApiError::field(
            StatusCode::NOT_FOUND,
            "key",
            format!(
                "no item '{}' in namespace [{}] of yours",
                super::echoed(&q.key),
                super::echoed(&namespace.join(", "))
            ),
        )),
        Err(e) => Err(e.into()),
    }
}

/// `DELETE /store/items`: what it reads.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = ItemDelete)]
#[schema(example = json!({"namespace": ["prefs"], "key": "lang"}))]
struct Delete {
    #[serde(default)]
    namespace: Vec<String>,
    key: String,
}

/// `DELETE /store/items`: 204 whether or not there was such an item, as LangGraph answers.
#[utoipa::path(delete, path = "/store/items", tag = LANGGRAPH, request_body = Delete,
    responses((status = 204, description = "Gone (or never there)."), Refusals))]
pub(crate) async fn delete(State(app): State<AppState>, Asker(who): Asker, body: Bytes) -> Result<Response, ApiError> {
    let d: Delete = json_body(&body)?;
    app.chat().delete_item(&who.principal, &d.namespace, &d.key).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /store/items/search`: what it reads.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = ItemSearch)]
#[schema(example = json!({"namespace_prefix": ["prefs"], "query": "language", "limit": 10}))]
struct Search {
    #[serde(default)]
    namespace_prefix: Vec<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    filter: Option<Map<String, Value>>,
    #[serde(default = "ten")]
    #[schema(minimum = 1, maximum = 1000)]
    limit: usize,
    #[serde(default)]
    offset: usize,
    #[serde(default)]
    query: Option<String>,
    #[serde(default)]
    refresh_ttl: Option<bool>,
}

fn ten() -> usize {
    10
}

/// `POST /store/items/search`: `{items}`, each with its `score` (null without a query).
#[utoipa::path(post, path = "/store/items/search", tag = LANGGRAPH, request_body = Search,
    responses((status = 200, description = "The items found.", body = ItemList), Refusals))]
pub(crate) async fn search(State(app): State<AppState>, Asker(who): Asker, body: Bytes) -> Result<Response, ApiError> {
    let s: Search = json_body(&body)?;
    let search = ItemSearch {
        prefix: s.namespace_prefix,
        filter: s.filter.unwrap_or_default(),
        query: s.query.filter(|q| !q.trim().is_empty()),
        limit: bounded_limit(s.limit)?,
        offset: s.offset,
    };
    let found = app.chat().search_items(&who.principal, &search, s.refresh_ttl.unwrap_or(true)).await?;
    let items: Vec<Value> = found.iter().map(|(item, score)| shape(item, Some(*score))).collect();
    Ok(axum::Json(json!({ "items": items })).into_response())
}

/// `POST /store/namespaces`: what it reads.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[schema(as = NamespaceSearch)]
struct Namespaces {
    #[serde(default)]
    prefix: Option<Vec<String>>,
    #[serde(default)]
    suffix: Option<Vec<String>>,
    #[serde(default)]
    #[schema(minimum = 1)]
    max_depth: Option<usize>,
    #[serde(default = "hundred")]
    #[schema(minimum = 1, maximum = 1000)]
    limit: usize,
    #[serde(default)]
    offset: usize,
}

fn hundred() -> usize {
    100
}

/// `POST /store/namespaces`: `{namespaces}`.
#[utoipa::path(post, path = "/store/namespaces", tag = LANGGRAPH, request_body = Namespaces,
    responses((status = 200, description = "The namespaces.", body = NamespaceList), Refusals))]
pub(crate) async fn namespaces(
    State(app): State<AppState>,
    Asker(who): Asker,
    body: Bytes,
) -> Result<Response, ApiError> {
    let n: Namespaces = json_body(&body)?;
    if n.max_depth == Some(0) {
        return Err(ApiError::field(StatusCode::UNPROCESSABLE_ENTITY, "max_depth", "at least 1"));
    }
    let listing = NamespaceListing {
        prefix: n.prefix.unwrap_or_default(),
        suffix: n.suffix.unwrap_or_default(),
        max_depth: n.max_depth,
        limit: bounded_limit(n.limit)?,
        offset: n.offset,
    };
    let found = app.chat().item_namespaces(&who.principal, &listing).await?;
    Ok(axum::Json(json!({ "namespaces": found })).into_response())
}
