//! The tenant's schema in the academy admin's system prompt: `GET /internal/chatbot/schema?tenantId=N`
//! describes the tables the backend's `general_query` reads, so the model writes SQL against
//! the tenant's real schema. One call per tenant per [`SCHEMA_TTL`], not one per model call:
//! concurrent turns of a tenant whose entry is missing wait for a single call.

use crate::kit::PromptContext;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use toolgraph_conversations::backend::BackendConversationStore;
use toolgraph_conversations::backend::wire::{TenantSchema, path};

/// How long a tenant's schema is reused before it is asked for again.
pub const SCHEMA_TTL: Duration = Duration::from_secs(300);

/// How long a failed schema call is remembered, so a backend that is down is not asked (and
/// waited for) on every model call.
const FAILURE_TTL: Duration = Duration::from_secs(30);

/// Most tenants remembered; beyond it the oldest entry goes.
const MAX_TENANTS: usize = 1024;

/// Per tenant: when it was asked, and the prompt text (`None`: the call failed).
type Cache = Mutex<HashMap<i64, (Instant, Option<Arc<str>>)>>;

/// The system-prompt addition of a turn: its tenant's schema description from `backend`.
/// A failing backend adds nothing (logged, and not asked again for 30 s), so the turn still
/// runs; a turn whose state has no tenant adds nothing either.
pub fn tenant_schema_prompt(backend: BackendConversationStore) -> PromptContext {
    let cache: Arc<Cache> = Arc::default();
    let gates: Arc<Gates> = Arc::default();
    Arc::new(move |context: &Map<String, Value>| {
        let (backend, cache, gates) = (backend.clone(), Arc::clone(&cache), Arc::clone(&gates));
        let tenant = context.get("tenantId").and_then(Value::as_i64);
        let slug = context.get("tenant").and_then(Value::as_str).map(str::to_owned);
        Box::pin(async move {
            let (tenant, slug) = (tenant?, slug?);
            if let Some(known) = cached(&cache, tenant) {
                return known;
            }
            // One call at a time per tenant; whoever waited finds the answer in the cache.
            let gate = Arc::clone(lock(&gates).entry(tenant).or_default());
            let text = {
                let _turn = gate.lock().await;
                match cached(&cache, tenant) {
                    Some(known) => known,
                    None => {
                        let text = fetch(&backend, tenant, &slug).await;
                        remember(&cache, tenant, text.clone());
                        text
                    }
                }
            };
            release(&gates, tenant, gate);
            text
        })
    })
}

/// Asks the backend for `tenant`'s schema; `None` (logged) when it fails.
async fn fetch(backend: &BackendConversationStore, tenant: i64, slug: &str) -> Option<Arc<str>> {
    let query = format!("tenantId={tenant}");
    match backend.get_for_tenant::<TenantSchema>(path::SCHEMA, &query, slug).await {
        Ok(answer) => Some(format!("Database schema of this tenant:\n{}", answer.schema).into()),
        Err(e) => {
            tracing::warn!(tenant, error = %e, "cannot get the tenant schema; turns run without it for 30 s");
            None
        }
    }
}

/// Per tenant, the lock a schema call holds while it runs.
type Gates = Mutex<HashMap<i64, Arc<tokio::sync::Mutex<()>>>>;

/// Drops a turn's copy of its tenant's gate, and the gate itself once no turn holds it.
/// Copies are taken and dropped only under the map's lock, so the count is exact.
fn release(gates: &Gates, tenant: i64, gate: Arc<tokio::sync::Mutex<()>>) {
    let mut open = lock(gates);
    drop(gate);
    if open.get(&tenant).is_some_and(|g| Arc::strong_count(g) == 1) {
        open.remove(&tenant);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A fresh entry: `Some(Some(text))` a schema, `Some(None)` a recent failure, `None` unknown.
fn cached(cache: &Cache, tenant: i64) -> Option<Option<Arc<str>>> {
    let cache = lock(cache);
    let (at, text) = cache.get(&tenant)?;
    let ttl = if text.is_some() { SCHEMA_TTL } else { FAILURE_TTL };
    (at.elapsed() < ttl).then(|| text.clone())
}

fn remember(cache: &Cache, tenant: i64, text: Option<Arc<str>>) {
    let mut cache = lock(cache);
    if cache.len() >= MAX_TENANTS
        && !cache.contains_key(&tenant)
        && let Some(oldest) = cache.iter().min_by_key(|(_, (at, _))| *at).map(|(t, _)| *t)
    {
        cache.remove(&oldest);
    }
    cache.insert(tenant, (Instant::now(), text));
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use toolgraph_conversations::backend::BackendOptions;

    fn context(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap_or_default()
    }

    #[tokio::test]
    async fn no_tenant_or_no_backend_adds_nothing() {
        // Nothing listens on port 9 (discard): the call fails at once.
        let options = BackendOptions {
            base_url: "http://127.0.0.1:9".into(),
            secret: b"0123456789abcdef".to_vec(),
            timeout: Duration::from_secs(2),
        };
        let prompt = tenant_schema_prompt(BackendConversationStore::new(options).unwrap());
        assert_eq!(prompt(&context(json!({"tenant": "acme"}))).await, None, "no tenantId");
        assert_eq!(prompt(&context(json!({"tenant": "acme", "tenantId": 1}))).await, None, "backend down");
    }

    #[tokio::test]
    async fn concurrent_turns_of_a_tenant_share_one_call() {
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&calls);
        let app = axum::Router::new().route(
            path::SCHEMA,
            axum::routing::get(move || {
                let counted = Arc::clone(&counted);
                async move {
                    counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    axum::Json(json!({"schema": "orders(id)"}))
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base_url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let options =
            BackendOptions { base_url, secret: b"0123456789abcdef".to_vec(), timeout: Duration::from_secs(5) };
        let prompt = tenant_schema_prompt(BackendConversationStore::new(options).unwrap());
        let ctx = context(json!({"tenant": "acme", "tenantId": 4}));
        let answers = futures::future::join_all((0..10).map(|_| prompt(&ctx))).await;
        assert!(answers.iter().all(|a| a.as_deref().is_some_and(|t| t.contains("orders(id)"))), "{answers:?}");
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1, "ten concurrent turns, one call");
    }

    #[test]
    fn the_cache_keeps_schemas_and_failures_and_drops_the_oldest() {
        let cache: Cache = Mutex::default();
        remember(&cache, 1, Some("a".into()));
        remember(&cache, 2, None);
        // Later entries must be strictly newer for "oldest" to be well defined.
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(cached(&cache, 1), Some(Some("a".into())));
        assert_eq!(cached(&cache, 2), Some(None), "a recent failure is remembered");
        assert_eq!(cached(&cache, 3), None);
        for t in 10..(MAX_TENANTS as i64 + 10) {
            remember(&cache, t, Some("x".into()));
        }
        let cache = cache.lock().unwrap();
        assert_eq!(cache.len(), MAX_TENANTS);
        assert!(!cache.contains_key(&1) && !cache.contains_key(&2), "the oldest went first");
        assert!(cache.contains_key(&(MAX_TENANTS as i64 + 9)));
    }
}
