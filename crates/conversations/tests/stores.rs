//! Every conversation store against one suite: what the chat service relies on — one running
//! turn per conversation, pending actions found only by their owner and decided once, deletion
//! that takes everything with it — holds in memory, in SQLite and in PostgreSQL alike, and in
//! PostgreSQL behind PgBouncer in transaction mode (`postgres_pooled`, one server connection
//! shared by every client connection, as a busy pooler has it).

use serde_json::json;
use std::str::FromStr;
use std::sync::Arc;
use toolgraph_conversations::items::IndexFields;
use toolgraph_conversations::{
    ConversationStore, Decided, ItemVector, MemoryConversationStore, MemoryItem, NewPending, PendingLookup,
    PostgresConversationStore, ReleasedTurn, Role, SqliteConversationStore, Thread, TurnClaim, TurnUsage,
};
use toolgraph_graph::{PgPooling, PostgresCheckpointer, SqliteCheckpointer};
use toolgraph_testkit::PgSchema;
use toolgraph_testkit::pgbouncer::TransactionPooler;

/// A store of `kind` and what keeps its data alive; `None` when PostgreSQL is absent locally.
async fn store(kind: &str) -> Option<(Arc<dyn ConversationStore>, Box<dyn std::any::Any>)> {
    Some(match kind {
        "memory" => (Arc::new(MemoryConversationStore::new()), Box::new(())),
        "sqlite" => {
            let dir = tempfile::tempdir().expect("tempdir");
            let ckpt = SqliteCheckpointer::open(&dir.path().join("t.db")).await.expect("open");
            let store = SqliteConversationStore::new(ckpt.database().clone()).await.expect("migrate");
            (Arc::new(store), Box::new(dir))
        }
        "postgres" => {
            let schema = PgSchema::create().await?;
            let ckpt = PostgresCheckpointer::connect_with(schema.options()).await.expect("connect");
            let store = PostgresConversationStore::new(ckpt.pool().clone()).await.expect("migrate");
            (Arc::new(store), Box::new(schema))
        }
        "postgres_pooled" => {
            let pooler = TransactionPooler::start(1).await?;
            let (pooled, direct) = (pooler.pooled_url(), pooler.direct_url());
            let options = |url: &str| sqlx::postgres::PgConnectOptions::from_str(url).expect("url");
            let ckpt =
                PostgresCheckpointer::connect_pooled(options(&pooled), PgPooling::Transaction, Some(options(&direct)))
                    .await
                    .expect("connect through the pooler");
            let store = PostgresConversationStore::open(ckpt.database().clone()).await.expect("migrate");
            (Arc::new(store), Box::new(pooler))
        }
        other => panic!("unknown store {other}"),
    })
}

fn pending(conversation: i64, run: &str, interrupt: &str) -> NewPending {
    NewPending {
        conversation_id: conversation,
        run_id: run.into(),
        interrupt_id: interrupt.into(),
        tool_name: "send_sms".into(),
        description: format!("Send an SMS ({interrupt})"),
        arguments: json!({"to": "+34600111222", "text": "hola"}),
    }
}

fn claim(run: &str, owner: &str, lease_ms: i64) -> TurnClaim {
    TurnClaim { run_id: run.into(), owner: owner.into(), lease_ms }
}

async fn one_turn_runs_at_a_time(store: &dyn ConversationStore) {
    let conv = store.create_conversation(7, 1, "lumie").await.unwrap();
    assert!(store.begin_turn(conv, &claim("r1", "a", 60_000)).await.unwrap());
    assert!(!store.begin_turn(conv, &claim("r2", "b", 60_000)).await.unwrap(), "a live lease holds");
    store.end_turn(conv, "r2").await.unwrap();
    assert!(!store.begin_turn(conv, &claim("r2", "b", 60_000)).await.unwrap(), "only the holder releases");
    assert!(store.renew_turn(conv, &claim("r1", "a", 60_000)).await.unwrap(), "the holder renews");
    assert!(!store.renew_turn(conv, &claim("r2", "b", 60_000)).await.unwrap(), "another run cannot");
    store.end_turn(conv, "r1").await.unwrap();
    assert!(store.begin_turn(conv, &claim("r3", "b", 60_000)).await.unwrap());
}

async fn an_expired_lease_is_taken_over_and_its_holder_learns_it(store: &dyn ConversationStore) {
    let conv = store.create_conversation(7, 1, "lumie").await.unwrap();
    // A lease that ended (its holder stopped renewing: it died or hung).
    assert!(store.begin_turn(conv, &claim("dead", "a", -1)).await.unwrap());
    assert!(store.begin_turn(conv, &claim("next", "b", 60_000)).await.unwrap(), "an expired lease is taken over");
    assert!(!store.renew_turn(conv, &claim("dead", "a", 60_000)).await.unwrap(), "the old holder lost it");
    assert!(store.renew_turn(conv, &claim("next", "b", 60_000)).await.unwrap());
}

async fn a_restarted_owner_frees_what_it_held(store: &dyn ConversationStore) {
    let first = store.create_conversation(7, 1, "lumie").await.unwrap();
    let second = store.create_conversation(8, 2, "tutor").await.unwrap();
    let elsewhere = store.create_conversation(7, 3, "lumie").await.unwrap();
    for (conv, run, owner) in
        [(first, "r1", "host-a:8000"), (second, "r2", "host-a:8000"), (elsewhere, "r3", "host-b:8000")]
    {
        assert!(store.begin_turn(conv, &claim(run, owner, 60_000)).await.unwrap());
    }
    let mut released = store.release_owner("host-a:8000").await.unwrap();
    released.sort_by_key(|r| r.conversation_id);
    assert_eq!(
        released,
        [
            ReleasedTurn {
                tenant_id: 7,
                conversation_id: first,
                agent: "lumie".into(),
                user_id: 1,
                run_id: "r1".into()
            },
            ReleasedTurn {
                tenant_id: 8,
                conversation_id: second,
                agent: "tutor".into(),
                user_id: 2,
                run_id: "r2".into()
            },
        ]
    );
    assert!(store.begin_turn(first, &claim("again", "host-a:8000", 60_000)).await.unwrap(), "free at once");
    assert!(!store.begin_turn(elsewhere, &claim("x", "host-a:8000", 60_000)).await.unwrap(), "another owner's stays");
    assert!(store.release_owner("nobody").await.unwrap().is_empty());
}

async fn a_sweeping_replica_takes_over_expired_leases_only(store: &dyn ConversationStore) {
    let dead = store.create_conversation(7, 1, "lumie").await.unwrap();
    let live = store.create_conversation(7, 2, "lumie").await.unwrap();
    let idle = store.create_conversation(8, 3, "tutor").await.unwrap();
    let dead_too = store.create_conversation(8, 4, "tutor").await.unwrap();
    assert!(store.begin_turn(dead, &claim("dead-1", "host-a", -1)).await.unwrap());
    assert!(store.begin_turn(live, &claim("live", "host-b", 60_000)).await.unwrap());
    assert!(store.begin_turn(dead_too, &claim("dead-2", "host-a", -1)).await.unwrap());
    let _ = idle;
    let taker = claim("sweep-1", "host-c", 60_000);
    // A bounded batch: one now, the other on the next sweep.
    let first = store.take_over_expired(&taker, 1).await.unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!((first[0].conversation_id, first[0].run_id.as_str(), first[0].user_id), (dead, "dead-1", 1));
    let rest = store.take_over_expired(&taker, 10).await.unwrap();
    assert_eq!(
        rest.iter().map(|r| (r.tenant_id, r.conversation_id, r.agent.as_str(), r.run_id.as_str())).collect::<Vec<_>>(),
        [(8, dead_too, "tutor", "dead-2")]
    );
    assert!(store.take_over_expired(&taker, 10).await.unwrap().is_empty(), "taken ones are held now");
    // The taker holds them: the dead holder cannot renew, nobody else can begin, and the taker's
    // own end frees them.
    assert!(!store.renew_turn(dead, &claim("dead-1", "host-a", 60_000)).await.unwrap());
    assert!(!store.begin_turn(dead, &claim("other", "host-b", 60_000)).await.unwrap());
    assert!(store.renew_turn(live, &claim("live", "host-b", 60_000)).await.unwrap(), "a live lease is left");
    store.end_turn(dead, "sweep-1").await.unwrap();
    store.end_turn(dead_too, "sweep-1").await.unwrap();
    assert!(store.begin_turn(dead, &claim("next", "host-b", 60_000)).await.unwrap());
    assert!(store.begin_turn(dead_too, &claim("next", "host-b", 60_000)).await.unwrap());
}

async fn pending_actions_are_found_by_their_owner_and_decided_once(store: &dyn ConversationStore) {
    let conv = store.create_conversation(7, 1, "lumie").await.unwrap();
    let first = store.add_pending(&pending(conv, "run-a", "i1")).await.unwrap();
    let second = store.add_pending(&pending(conv, "run-a", "i2")).await.unwrap();
    let lookup = PendingLookup { tenant_id: 7, user_id: 1, conversation_id: conv, message_id: first };
    let found = store.pending(&lookup).await.unwrap().expect("the owner finds it");
    assert_eq!((found.message_id, found.action.clone()), (first, pending(conv, "run-a", "i1")));
    assert_eq!(found.decision, None);
    for stranger in [
        PendingLookup { tenant_id: 8, ..lookup },
        PendingLookup { user_id: 2, ..lookup },
        PendingLookup { conversation_id: conv + 1, ..lookup },
    ] {
        assert_eq!(store.pending(&stranger).await.unwrap(), None, "{stranger:?}");
    }
    assert_eq!(store.decide(first, true).await.unwrap(), Decided::Recorded);
    assert_eq!(store.decide(first, true).await.unwrap(), Decided::Same);
    assert_eq!(store.decide(first, false).await.unwrap(), Decided::Conflict);
    let group = store.run_pending(conv, "run-a").await.unwrap();
    assert_eq!(group.iter().map(|p| p.message_id).collect::<Vec<_>>(), [first, second], "in message order");
    assert_eq!(group.iter().map(|p| p.decision).collect::<Vec<_>>(), [Some(true), None]);
    store.set_response(conv, "run-a", "{\"message\":\"done\"}").await.unwrap();
    let again = store.pending(&lookup).await.unwrap().unwrap();
    assert_eq!(again.response.as_deref(), Some("{\"message\":\"done\"}"));
    // Each pending action is a message of the conversation too, with its description.
    let messages = store.messages(conv).await.unwrap();
    assert_eq!(
        messages.iter().map(|m| (m.id, m.role)).collect::<Vec<_>>(),
        [(first, Role::Pending), (second, Role::Pending)]
    );
    assert_eq!(messages[0].content, "Send an SMS (i1)");
}

async fn deleting_takes_messages_and_pending_actions_with_it(store: &dyn ConversationStore) {
    let mine = store.create_conversation(7, 1, "lumie").await.unwrap();
    let other_user = store.create_conversation(7, 2, "lumie").await.unwrap();
    let other_tenant = store.create_conversation(9, 1, "lumie").await.unwrap();
    let user = store.add_message(mine, Role::User, "hola").await.unwrap();
    let reply = store.add_message(mine, Role::Assistant, "¿qué tal?").await.unwrap();
    assert!(reply > user, "ids grow");
    let action = store.add_pending(&pending(mine, "r", "i-mine")).await.unwrap();
    assert!(!store.delete_conversation(7, 2, mine).await.unwrap(), "not another user's to delete");
    assert!(store.delete_conversation(7, 1, mine).await.unwrap());
    assert_eq!(store.conversation(7, 1, mine).await.unwrap(), None);
    assert!(store.messages(mine).await.unwrap().is_empty());
    let lookup = PendingLookup { tenant_id: 7, user_id: 1, conversation_id: mine, message_id: action };
    assert_eq!(store.pending(&lookup).await.unwrap(), None);
    assert_eq!(store.delete_user(7, 2).await.unwrap(), [other_user]);
    assert_eq!(store.delete_tenant(9).await.unwrap(), [other_tenant]);
    assert_eq!(store.conversation(9, 1, other_tenant).await.unwrap(), None);
}

async fn a_rolled_back_run_takes_its_last_messages_and_their_pending_actions(store: &dyn ConversationStore) {
    let mine = store.create_conversation(7, 1, "tutor").await.unwrap();
    let other = store.create_conversation(7, 1, "tutor").await.unwrap();
    store.add_message(mine, Role::User, "hola").await.unwrap();
    store.add_message(mine, Role::Assistant, "¿qué tal?").await.unwrap();
    store.add_message(other, Role::User, "otra").await.unwrap();
    store.add_message(mine, Role::User, "apunta el examen").await.unwrap();
    let action = store.add_pending(&pending(mine, "r2", "i-rolled")).await.unwrap();
    // The run wrote the question and the pending action (its message): both go.
    assert_eq!(store.delete_last_messages(mine, 2).await.unwrap(), 2);
    let left: Vec<String> = store.messages(mine).await.unwrap().into_iter().map(|m| m.content).collect();
    assert_eq!(left, ["hola", "¿qué tal?"]);
    let lookup = PendingLookup { tenant_id: 7, user_id: 1, conversation_id: mine, message_id: action };
    assert_eq!(store.pending(&lookup).await.unwrap(), None, "the pending action went with its message");
    assert!(store.run_pending(mine, "r2").await.unwrap().is_empty());
    assert_eq!(store.messages(other).await.unwrap().len(), 1, "another conversation's stay");
    assert_eq!(store.delete_last_messages(mine, 10).await.unwrap(), 2, "no more than it has");
}

async fn conversations_are_listed_for_their_owner_newest_first(store: &dyn ConversationStore) {
    let first = store.create_conversation(7, 1, "tutor").await.unwrap();
    store.add_message(first, Role::User, &"¿Cuándo es el examen final de la asignatura? ".repeat(4)).await.unwrap();
    store.add_message(first, Role::Assistant, "El 20 de enero.").await.unwrap();
    store.add_message(first, Role::User, "¿Y cuánto vale?").await.unwrap();
    let second = store.create_conversation(7, 1, "academy").await.unwrap();
    let other_user = store.create_conversation(7, 2, "tutor").await.unwrap();
    let other_tenant = store.create_conversation(8, 1, "tutor").await.unwrap();
    store.add_message(other_user, Role::User, "not yours").await.unwrap();
    let listed = store.list_conversations(7, 1, 10).await.unwrap();
    let ids: Vec<i64> = listed.iter().map(|c| c.id).collect();
    assert_eq!(ids, [second, first], "the owner's only, newest first");
    assert_eq!((listed[0].agent.as_str(), listed[0].title.as_str()), ("academy", ""), "no message yet");
    assert_eq!(listed[1].title.chars().count(), toolgraph_conversations::SUMMARY_TITLE_CHARS);
    assert!(listed[1].title.starts_with("¿Cuándo es el examen final"), "{:?}", listed[1].title);
    assert_eq!(store.list_conversations(7, 1, 1).await.unwrap().len(), 1, "the limit holds");
    assert_eq!(
        store.list_conversations(8, 1, 10).await.unwrap().iter().map(|c| c.id).collect::<Vec<_>>(),
        [other_tenant]
    );
}

fn thread(id: &str, tenant: i64, user: i64, at: i64) -> Thread {
    let metadata = json!({"topic": "exams", "n": at}).as_object().cloned().unwrap_or_default();
    Thread { id: id.into(), tenant, user, conversation: None, metadata, created_at_ms: at, updated_at_ms: at }
}

async fn threads_belong_to_their_owner_and_bind_one_conversation(store: &dyn ConversationStore) {
    assert!(store.create_thread(&thread("t-1", 7, 1, 1)).await.unwrap());
    assert!(store.create_thread(&thread("t-2", 7, 1, 2)).await.unwrap());
    assert!(store.create_thread(&thread("t-3", 7, 2, 3)).await.unwrap());
    assert!(!store.create_thread(&thread("t-1", 7, 1, 4)).await.unwrap(), "an id is its owner's once");
    assert!(store.create_thread(&thread("t-1", 9, 5, 4)).await.unwrap(), "ids are each person's own");
    assert_eq!(store.thread(7, 1, "t-1").await.unwrap(), Some(thread("t-1", 7, 1, 1)), "as kept");
    assert_eq!(store.thread(7, 2, "t-1").await.unwrap(), None, "not another user's");
    assert_eq!(store.thread(9, 1, "t-1").await.unwrap(), None, "not another tenant's");
    assert_eq!(store.thread(9, 5, "t-1").await.unwrap(), Some(thread("t-1", 9, 5, 4)), "the other's own");
    let ids = |list: Vec<Thread>| list.into_iter().map(|t| t.id).collect::<Vec<_>>();
    assert_eq!(ids(store.threads(7, 1).await.unwrap()), ["t-2", "t-1"], "theirs, the latest changed first");

    // The first run binds its conversation; a later one does not move it.
    let c = store.create_conversation(7, 1, "tutor").await.unwrap();
    let other = store.create_conversation(7, 1, "tutor").await.unwrap();
    assert!(store.update_thread(7, 1, "t-1", None, Some(c)).await.unwrap());
    assert!(store.update_thread(7, 1, "t-1", None, Some(other)).await.unwrap());
    let bound = store.thread(7, 1, "t-1").await.unwrap().unwrap();
    assert_eq!((bound.conversation, &bound.metadata), (Some(c), &thread("t-1", 7, 1, 1).metadata));
    assert!(bound.updated_at_ms > 1);
    assert_eq!(ids(store.threads(7, 1).await.unwrap()), ["t-1", "t-2"], "changed: first");
    let metadata = json!({"topic": "grades"}).as_object().cloned().unwrap_or_default();
    assert!(!store.update_thread(7, 2, "t-1", Some(&metadata), None).await.unwrap(), "not another user's");
    assert!(store.update_thread(7, 1, "t-1", Some(&metadata), None).await.unwrap());
    assert_eq!(store.thread(7, 1, "t-1").await.unwrap().unwrap().metadata, metadata);

    // A fork moves it, only from the conversation it is bound to, and only its owner's.
    let fork = store.create_conversation(7, 1, "tutor").await.unwrap();
    assert!(!store.rebind_thread(7, 1, "t-1", other, fork).await.unwrap(), "not bound to that one");
    assert!(!store.rebind_thread(7, 2, "t-1", c, fork).await.unwrap(), "not another user's");
    assert_eq!(store.thread(7, 1, "t-1").await.unwrap().unwrap().conversation, Some(c));
    let someone_elses = store.create_conversation(7, 2, "tutor").await.unwrap();
    assert!(!store.rebind_thread(7, 1, "t-1", c, someone_elses).await.unwrap(), "not to another's conversation");
    assert!(store.rebind_thread(7, 1, "t-1", c, fork).await.unwrap());
    assert_eq!(store.thread(7, 1, "t-1").await.unwrap().unwrap().conversation, Some(fork));
    assert_eq!(store.thread_branches(7, 1, "t-1").await.unwrap(), [c], "the branch it left");
    assert_eq!(store.thread_branches(7, 2, "t-1").await.unwrap(), Vec::<i64>::new(), "only its owner's");
    assert!(store.rebind_thread(7, 1, "t-1", fork, c).await.unwrap(), "and back");
    assert_eq!(store.thread_branches(7, 1, "t-1").await.unwrap(), [fork], "its current one is no branch");
    assert!(store.delete_conversation(7, 1, fork).await.unwrap());
    assert_eq!(store.thread_branches(7, 1, "t-1").await.unwrap(), Vec::<i64>::new(), "a deleted branch goes");
    // A thread gone with its conversation takes its branch rows: a new thread of its id has none.
    assert!(store.create_thread(&thread("t-b", 7, 1, 5)).await.unwrap());
    let (left, now) = (
        store.create_conversation(7, 1, "tutor").await.unwrap(),
        store.create_conversation(7, 1, "tutor").await.unwrap(),
    );
    assert!(store.update_thread(7, 1, "t-b", None, Some(left)).await.unwrap());
    assert!(store.rebind_thread(7, 1, "t-b", left, now).await.unwrap());
    assert!(store.delete_conversation(7, 1, now).await.unwrap());
    assert_eq!(store.thread(7, 1, "t-b").await.unwrap(), None);
    assert!(store.create_thread(&thread("t-b", 7, 1, 6)).await.unwrap());
    assert_eq!(store.thread_branches(7, 1, "t-b").await.unwrap(), Vec::<i64>::new(), "not inherited");
    assert!(store.delete_thread(7, 1, "t-b").await.unwrap().is_some());

    // Deleting its conversation takes the thread; deleting a thread leaves its conversation
    // to the caller; deleting a user takes their threads.
    assert!(store.delete_conversation(7, 1, c).await.unwrap());
    assert_eq!(store.thread(7, 1, "t-1").await.unwrap(), None);
    assert_eq!(store.delete_thread(7, 2, "t-2").await.unwrap(), None, "not another user's");
    assert_eq!(store.delete_thread(7, 1, "t-2").await.unwrap().map(|t| t.id), Some("t-2".into()));
    assert_eq!(store.thread(7, 1, "t-2").await.unwrap(), None);
    store.delete_user(7, 2).await.unwrap();
    assert_eq!(store.thread(7, 2, "t-3").await.unwrap(), None);
    assert!(store.conversation(7, 1, other).await.unwrap().is_some());
}

fn ns(labels: &[&str]) -> Vec<String> {
    labels.iter().map(|l| l.to_string()).collect()
}

fn memory_item(labels: &[&str], key: &str, text: &str, ttl_ms: Option<i64>, now: i64) -> MemoryItem {
    let value = json!({"text": text}).as_object().cloned().unwrap_or_default();
    MemoryItem::new(ns(labels), key.into(), value, ttl_ms, now)
}

async fn memory_items_are_each_persons_expire_and_go_with_their_owner(store: &dyn ConversationStore) {
    let t0 = 1_000_000;
    store.put_item(7, 1, &memory_item(&["prefs"], "lang", "Prefers Spanish", None, t0)).await.unwrap();
    store.put_item(7, 1, &memory_item(&["prefs", "school"], "class", "Child in 5A", None, t0 + 1)).await.unwrap();
    store.put_item(7, 1, &memory_item(&["prefsx"], "other", "not under prefs", None, t0 + 2)).await.unwrap();
    store.put_item(7, 1, &memory_item(&["notes"], "soon", "expires", Some(1_000), t0 + 3)).await.unwrap();
    store.put_item(7, 2, &memory_item(&["prefs"], "lang", "another person's", None, t0)).await.unwrap();
    store.put_item(9, 1, &memory_item(&["prefs"], "lang", "another tenant's", None, t0)).await.unwrap();

    let got = store.item(7, 1, &ns(&["prefs"]), "lang", t0 + 10).await.unwrap().unwrap();
    assert_eq!((got.value["text"].as_str(), got.created_at_ms), (Some("Prefers Spanish"), t0));
    assert_eq!(store.item(7, 2, &ns(&["prefs"]), "lang", t0).await.unwrap().unwrap().value["text"], "another person's");
    assert_eq!(store.item(7, 3, &ns(&["prefs"]), "lang", t0).await.unwrap(), None, "not another user's");

    // Under a prefix: the namespace and those below it, not one that only starts alike; the
    // most recently written first.
    let keys = |items: Vec<MemoryItem>| items.into_iter().map(|i| i.key).collect::<Vec<_>>();
    assert_eq!(keys(store.items(7, 1, &ns(&["prefs"]), t0 + 10).await.unwrap()), ["class", "lang"]);
    assert_eq!(keys(store.items(7, 1, &[], t0 + 10).await.unwrap()), ["soon", "other", "class", "lang"]);

    assert_eq!(store.count_items(7, 1, t0 + 10).await.unwrap(), 4);
    let names = store.item_namespaces(7, 1, &ns(&["prefs"]), t0 + 10).await.unwrap();
    assert_eq!(names, [ns(&["prefs"]), ns(&["prefs", "school"])], "each once, not prefsx");

    // Rewritten: the new value, its first write kept.
    store.put_item(7, 1, &memory_item(&["prefs"], "lang", "Prefers Catalan", None, t0 + 20)).await.unwrap();
    let got = store.item(7, 1, &ns(&["prefs"]), "lang", t0 + 21).await.unwrap().unwrap();
    assert_eq!(
        (got.value["text"].as_str(), got.created_at_ms, got.updated_at_ms),
        (Some("Prefers Catalan"), t0, t0 + 20)
    );

    // A time to live: read with a refresh it lives on; unread it expires, is not found, and pruned.
    store.refresh_items(7, 1, &[(ns(&["notes"]), "soon".into())], t0 + 900).await.unwrap();
    assert!(store.item(7, 1, &ns(&["notes"]), "soon", t0 + 1_500).await.unwrap().is_some(), "refreshed at +900");
    assert_eq!(store.item(7, 1, &ns(&["notes"]), "soon", t0 + 1_901).await.unwrap(), None, "expired");
    assert!(!keys(store.items(7, 1, &[], t0 + 1_901).await.unwrap()).contains(&"soon".to_owned()));
    assert_eq!(store.count_items(7, 1, t0 + 1_901).await.unwrap(), 3, "the expired one no longer counts");
    // Written again once expired (not yet pruned): a new item, first written now.
    store.put_item(7, 1, &memory_item(&["notes"], "soon", "again", Some(1_000), t0 + 1_950)).await.unwrap();
    let again = store.item(7, 1, &ns(&["notes"]), "soon", t0 + 1_951).await.unwrap().unwrap();
    assert_eq!(again.created_at_ms, t0 + 1_950);
    assert_eq!(store.prune_items(t0 + 1_901).await.unwrap(), 0, "not expired any more");
    assert_eq!(store.prune_items(t0 + 2_951).await.unwrap(), 1);

    assert!(store.delete_item(7, 1, &ns(&["prefsx"]), "other").await.unwrap());
    assert!(!store.delete_item(7, 1, &ns(&["prefsx"]), "other").await.unwrap(), "gone");
    assert!(!store.delete_item(7, 3, &ns(&["prefs"]), "lang").await.unwrap(), "not another user's");

    // A person's deletion takes their items; a tenant's, its people's.
    store.delete_user(7, 1).await.unwrap();
    assert!(store.items(7, 1, &[], t0).await.unwrap().is_empty());
    assert_eq!(store.items(7, 2, &[], t0).await.unwrap().len(), 1, "the other person's stay");
    store.delete_tenant(9).await.unwrap();
    assert!(store.items(9, 1, &[], t0).await.unwrap().is_empty());
}

async fn item_vectors_are_kept_with_their_model_and_set_only_on_the_item_embedded(store: &dyn ConversationStore) {
    let t0 = 2_000_000;
    let vector = |values: Vec<f32>| Some(ItemVector { model: "e5".into(), values });
    let mut cat = memory_item(&["m"], "cat", "Has a cat", None, t0);
    cat.vector = vector(vec![0.25, -0.5, 1.0]);
    store.put_item(7, 1, &cat).await.unwrap();
    let mut off = memory_item(&["m"], "off", "Not embedded", None, t0);
    off.index = IndexFields::Off;
    store.put_item(7, 1, &off).await.unwrap();
    let mut only = memory_item(&["m"], "only", "Some fields", None, t0);
    only.index = IndexFields::Only(vec!["text".into(), "$".into()]);
    store.put_item(7, 1, &only).await.unwrap();
    let read = |key: &'static str| async move { store.item(7, 1, &ns(&["m"]), key, t0).await.unwrap().unwrap() };
    assert_eq!(read("cat").await.vector, cat.vector, "the vector and its model, as written");
    assert_eq!((read("off").await.vector, read("off").await.index), (None, IndexFields::Off));
    assert_eq!(read("only").await.index, only.index);
    assert_eq!(store.items(7, 1, &ns(&["m"]), t0).await.unwrap().iter().filter(|i| i.vector.is_some()).count(), 1);

    // A search embedded `only` as it was written at t0; a rewrite at t0 + 5 in between keeps
    // its own (none), and a vector set for the item as written is kept.
    let mut embedded = only.clone();
    embedded.vector = vector(vec![1.0, 0.0, 0.0]);
    let mut rewritten = memory_item(&["m"], "only", "Rewritten", None, t0 + 5);
    rewritten.index = only.index.clone();
    store.put_item(7, 1, &rewritten).await.unwrap();
    store.set_item_vectors(7, 1, std::slice::from_ref(&embedded)).await.unwrap();
    assert_eq!(store.item(7, 1, &ns(&["m"]), "only", t0 + 6).await.unwrap().unwrap().vector, None);
    let mut now_embedded = rewritten.clone();
    now_embedded.vector = vector(vec![0.0, 1.0, 0.0]);
    store.set_item_vectors(7, 1, &[now_embedded.clone()]).await.unwrap();
    assert_eq!(store.item(7, 1, &ns(&["m"]), "only", t0 + 6).await.unwrap().unwrap().vector, now_embedded.vector);
    // Rewritten in the same millisecond with other text: the old text's vector is not set.
    let same_ms = memory_item(&["m"], "same", "First text", None, t0 + 10);
    store.put_item(7, 1, &same_ms).await.unwrap();
    let mut stale = same_ms.clone();
    stale.vector = vector(vec![1.0, 1.0, 1.0]);
    store.put_item(7, 1, &memory_item(&["m"], "same", "Second text", None, t0 + 10)).await.unwrap();
    store.set_item_vectors(7, 1, &[stale]).await.unwrap();
    assert_eq!(store.item(7, 1, &ns(&["m"]), "same", t0 + 11).await.unwrap().unwrap().vector, None);
    // Not another person's item of the same place.
    store.put_item(7, 2, &memory_item(&["m"], "cat", "Ben's", None, t0)).await.unwrap();
    let mut bens = cat.clone();
    bens.vector = vector(vec![9.0, 9.0, 9.0]);
    store.set_item_vectors(7, 1, &[bens]).await.unwrap();
    assert_eq!(store.item(7, 2, &ns(&["m"]), "cat", t0).await.unwrap().unwrap().vector, None);
    // A rewrite with no vector clears the old one (it described the old text).
    store.put_item(7, 1, &memory_item(&["m"], "cat", "Has two cats", None, t0 + 7)).await.unwrap();
    assert_eq!(store.item(7, 1, &ns(&["m"]), "cat", t0 + 8).await.unwrap().unwrap().vector, None);
}

fn usage(run: &str, model: &str, prompt: u64, completion: u64, at_ms: i64) -> TurnUsage {
    TurnUsage {
        run_id: run.into(),
        agent: "tutor".into(),
        model: model.into(),
        prompt,
        completion,
        cached_prompt: prompt / 2,
        calls: 2,
        at_ms,
    }
}

async fn token_usage_is_kept_per_turn_outlives_its_conversation_and_goes_with_its_owner(store: &dyn ConversationStore) {
    assert!(store.keeps_usage());
    let mine = store.create_conversation(7, 1, "tutor").await.unwrap();
    let other = store.create_conversation(7, 2, "tutor").await.unwrap();
    let elsewhere = store.create_conversation(9, 1, "tutor").await.unwrap();
    let first = [usage("r1", "small", 120, 30, 1_000), usage("r1", "big", 4_000, 500, 1_000)];
    store.record_usage(7, 1, mine, &first).await.unwrap();
    store.record_usage(7, 1, mine, &[usage("r2", "small", 200, 40, 2_000)]).await.unwrap();
    store.record_usage(7, 2, other, &[usage("r3", "small", 1, 1, 2_500)]).await.unwrap();
    store.record_usage(9, 1, elsewhere, &[usage("r4", "small", 1_000_000, 1, 2_500)]).await.unwrap();
    store.record_usage(7, 1, mine, &[]).await.unwrap();

    let kept = store.conversation_usage(mine).await.unwrap();
    assert_eq!(
        kept,
        vec![first[0].clone(), first[1].clone(), usage("r2", "small", 200, 40, 2_000)],
        "in order, as given"
    );
    // Prompt and completion of the tenant's turns at or after the time; no other tenant's.
    assert_eq!(store.tenant_tokens_since(7, 0).await.unwrap(), 150 + 4_500 + 240 + 2);
    assert_eq!(store.tenant_tokens_since(7, 2_000).await.unwrap(), 240 + 2);
    assert_eq!(store.tenant_tokens_since(7, 2_501).await.unwrap(), 0);

    // A deleted conversation's tokens still count against the tenant (deleting gives none back).
    assert!(store.delete_conversation(7, 1, mine).await.unwrap());
    assert_eq!(store.tenant_tokens_since(7, 0).await.unwrap(), 150 + 4_500 + 240 + 2);
    // A person's deletion takes their usage; a tenant's, everyone's in it.
    store.delete_user(7, 1).await.unwrap();
    assert_eq!(store.tenant_tokens_since(7, 0).await.unwrap(), 2);
    store.delete_tenant(9).await.unwrap();
    assert_eq!(store.tenant_tokens_since(9, 0).await.unwrap(), 0);
    assert_eq!(store.conversation_usage(other).await.unwrap().len(), 1, "another person's stays");
}

async fn idle_conversations_go_by_their_one_rule_and_a_running_one_stays(store: &dyn ConversationStore) {
    use toolgraph_conversations::{IdleRule, now_ms};
    let mine = |ids: &[(i64, i64)]| {
        let mut ids: Vec<i64> = ids.iter().map(|(_, c)| *c).collect();
        ids.sort_unstable();
        ids
    };
    let tutor7 = store.create_conversation(7, 1, "tutor").await.unwrap();
    let tutor9 = store.create_conversation(9, 1, "tutor").await.unwrap();
    let legal7 = store.create_conversation(7, 1, "legal").await.unwrap();
    let legal8 = store.create_conversation(8, 1, "legal").await.unwrap();
    let running = store.create_conversation(7, 1, "tutor").await.unwrap();
    assert!(store.begin_turn(running, &claim("run", "a", 60_000)).await.unwrap());
    let now = now_ms();
    let later = now + 1_000;

    // Nothing is idle before its time.
    let not_yet = IdleRule { idle_before_ms: now - 60_000, ..IdleRule::default() };
    assert!(store.delete_idle_conversations(&not_yet, now, 100).await.unwrap().is_empty());

    // Tenant 9's rule; the agent's rule, minus the tenants with their own; the default, minus both.
    let nine = IdleRule { idle_before_ms: later, tenant: Some(9), ..IdleRule::default() };
    assert_eq!(store.delete_idle_conversations(&nine, now, 100).await.unwrap(), vec![(9, tutor9)]);
    let legal = IdleRule {
        idle_before_ms: later,
        agent: Some("legal".into()),
        except_tenants: vec![8, 9],
        ..IdleRule::default()
    };
    assert_eq!(store.delete_idle_conversations(&legal, now, 100).await.unwrap(), vec![(7, legal7)]);
    let default = IdleRule {
        idle_before_ms: later,
        except_tenants: vec![8, 9],
        except_agents: vec!["legal".into()],
        ..IdleRule::default()
    };
    assert!(store.create_thread(&thread("bound", 7, 1, 1)).await.unwrap());
    assert!(store.update_thread(7, 1, "bound", None, Some(tutor7)).await.unwrap());
    let gone = store.delete_idle_conversations(&default, now, 100).await.unwrap();
    assert_eq!(mine(&gone), vec![tutor7], "the running one stays");
    assert!(store.thread(7, 1, "bound").await.unwrap().is_none(), "its thread went with it");
    assert!(store.conversation(7, 1, tutor7).await.unwrap().is_none());
    assert!(store.conversation(8, 1, legal8).await.unwrap().is_some(), "tenant 8 is another rule's");
    assert!(store.conversation(7, 1, running).await.unwrap().is_some());
    // Once its lease ran out (its replica died), a running one is idle too.
    let after_lease = now + 61_000;
    let default_then = IdleRule { idle_before_ms: after_lease, ..default.clone() };
    assert_eq!(store.delete_idle_conversations(&default_then, after_lease, 100).await.unwrap(), vec![(7, running)]);

    // A turn moves a conversation's idle time: one that just ran is not idle under a rule whose
    // time is before it.
    let fresh = store.create_conversation(7, 2, "tutor").await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let between = now_ms();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    assert!(store.begin_turn(fresh, &claim("r2", "a", 60_000)).await.unwrap());
    store.end_turn(fresh, "r2").await.unwrap();
    let before_turn = IdleRule { idle_before_ms: between, tenant: Some(7), ..IdleRule::default() };
    assert!(store.delete_idle_conversations(&before_turn, now_ms(), 100).await.unwrap().is_empty());

    // A batch is at most `limit`.
    let more: Vec<i64> = futures_batch(store, 3).await;
    let first = store.delete_idle_conversations(&default_then, after_lease, 2).await.unwrap();
    assert_eq!(first.len(), 2);
    let rest = store.delete_idle_conversations(&default_then, after_lease, 2).await.unwrap();
    let mut all = mine(&first);
    all.extend(mine(&rest));
    all.sort_unstable();
    let mut expected = more.clone();
    expected.push(fresh);
    expected.sort_unstable();
    assert_eq!(all, expected);

    // Threads that never ran go by their tenant's rule; a bound thread goes with its conversation.
    assert!(store.create_thread(&thread("old", 7, 1, 1)).await.unwrap());
    assert!(store.create_thread(&thread("old-9", 9, 1, 1)).await.unwrap());
    assert!(store.create_thread(&thread("new", 7, 1, later + 10)).await.unwrap());
    assert_eq!(store.delete_idle_threads(&legal).await.unwrap(), 0, "an agent's rule covers no unbound thread");
    assert_eq!(store.delete_idle_threads(&default).await.unwrap(), 1);
    assert!(store.thread(7, 1, "old").await.unwrap().is_none());
    assert!(store.thread(9, 1, "old-9").await.unwrap().is_some(), "tenant 9 has its own rule");
    assert!(store.thread(7, 1, "new").await.unwrap().is_some());

    // One pass per period, whoever claims it first.
    assert!(store.claim_pass("retention", "a", now, 3_600_000).await.unwrap());
    assert!(!store.claim_pass("retention", "b", now, 3_600_000).await.unwrap(), "the same pass");
    assert!(!store.claim_pass("retention", "b", now + 3_599_999, 3_600_000).await.unwrap());
    assert!(store.claim_pass("other-task", "b", now, 3_600_000).await.unwrap());
    assert!(store.claim_pass("retention", "b", now + 3_600_000, 3_600_000).await.unwrap(), "the next period's");

    // Old usage rows go; newer ones stay.
    let c = store.create_conversation(7, 1, "tutor").await.unwrap();
    let rows = [usage("r1", "m", 10, 1, 1_000), usage("r2", "m", 20, 2, 5_000)];
    store.record_usage(7, 1, c, &rows).await.unwrap();
    store.record_usage(7, 1, c, &[usage("r0", "m", 1, 1, 900)]).await.unwrap();
    assert_eq!(store.prune_usage(5_000, 1).await.unwrap(), 1, "at most the limit");
    assert_eq!(store.prune_usage(5_000, 10).await.unwrap(), 1);
    assert_eq!(store.conversation_usage(c).await.unwrap(), vec![rows[1].clone()]);
}

async fn uploads_are_their_owners_until_attached_or_a_day_old(store: &dyn ConversationStore) {
    let ids = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    store.put_upload(7, 1, "u1", "plan.md", b"# Plan", 1_000).await.unwrap();
    store.put_upload(7, 1, "u2", "data.pdf", &[0, 159, 146, 150], 2_000).await.unwrap();
    store.put_upload(7, 2, "u3", "theirs.md", b"another person's", 2_000).await.unwrap();
    assert!(store.put_upload(7, 1, "u1", "again.md", b"x", 3_000).await.is_err(), "an id is kept once");
    let mine = store.uploads(7, 1, &ids(&["u1", "u2", "u3", "nope"]), 0).await.unwrap();
    assert_eq!(mine.iter().map(|u| u.id.as_str()).collect::<Vec<_>>(), ["u1", "u2"], "only the owner's");
    assert_eq!((mine[1].name.as_str(), mine[1].bytes.as_slice()), ("data.pdf", &[0u8, 159, 146, 150][..]));
    assert!(store.uploads(9, 1, &ids(&["u1"]), 0).await.unwrap().is_empty(), "not another tenant's");
    let recent = store.uploads(7, 1, &ids(&["u1", "u2"]), 1_500).await.unwrap();
    assert_eq!(recent.iter().map(|u| u.id.as_str()).collect::<Vec<_>>(), ["u2"], "not one kept before the time");
    assert_eq!(store.delete_uploads(7, 2, &ids(&["u1"])).await.unwrap(), 0, "not another user's");
    assert_eq!(store.delete_uploads(7, 1, &ids(&["u1"])).await.unwrap(), 1);
    assert_eq!(store.prune_uploads(1_999).await.unwrap(), 0);
    assert_eq!(store.prune_uploads(2_001).await.unwrap(), 2);
    store.put_upload(7, 1, "u4", "plan.md", b"# Plan", 5_000).await.unwrap();
    store.delete_user(7, 1).await.unwrap();
    assert!(store.uploads(7, 1, &ids(&["u4"]), 0).await.unwrap().is_empty(), "a person's deletion takes them");
}

/// `n` new conversations of tenant 7 with no turn.
async fn futures_batch(store: &dyn ConversationStore, n: usize) -> Vec<i64> {
    let mut ids = Vec::new();
    for _ in 0..n {
        ids.push(store.create_conversation(7, 3, "tutor").await.unwrap());
    }
    ids
}

macro_rules! suite {
    ($kind:ident) => {
        mod $kind {
            macro_rules! case {
                ($name:ident) => {
                    #[tokio::test]
                    async fn $name() {
                        let Some((store, _keep)) = super::store(stringify!($kind)).await else { return };
                        super::$name(store.as_ref()).await;
                    }
                };
            }
            case!(one_turn_runs_at_a_time);
            case!(an_expired_lease_is_taken_over_and_its_holder_learns_it);
            case!(a_restarted_owner_frees_what_it_held);
            case!(a_sweeping_replica_takes_over_expired_leases_only);
            case!(pending_actions_are_found_by_their_owner_and_decided_once);
            case!(deleting_takes_messages_and_pending_actions_with_it);
            case!(a_rolled_back_run_takes_its_last_messages_and_their_pending_actions);
            case!(conversations_are_listed_for_their_owner_newest_first);
            case!(threads_belong_to_their_owner_and_bind_one_conversation);
            case!(memory_items_are_each_persons_expire_and_go_with_their_owner);
            case!(item_vectors_are_kept_with_their_model_and_set_only_on_the_item_embedded);
            case!(token_usage_is_kept_per_turn_outlives_its_conversation_and_goes_with_its_owner);
            case!(idle_conversations_go_by_their_one_rule_and_a_running_one_stays);
            case!(uploads_are_their_owners_until_attached_or_a_day_old);
        }
    };
}

suite!(memory);
suite!(sqlite);
suite!(postgres);
suite!(postgres_pooled);

/// The pooled suite does not pass by luck: the same store through the same pooler, but with
/// the driver's named prepared statements (`PgPooling::Session`), fails as soon as two client
/// connections share the server connection.
#[tokio::test]
async fn named_statements_break_behind_a_transaction_pooler() {
    let Some(pooler) = TransactionPooler::start(1).await else { return };
    let options = |url: &str| sqlx::postgres::PgConnectOptions::from_str(url).expect("url");
    let ckpt = PostgresCheckpointer::connect_pooled(
        options(&pooler.pooled_url()),
        PgPooling::Session,
        Some(options(&pooler.direct_url())),
    )
    .await
    .expect("connect");
    let store = Arc::new(PostgresConversationStore::open(ckpt.database().clone()).await.expect("migrate"));
    let mut calls = tokio::task::JoinSet::new();
    for user in 0..16 {
        let store = Arc::clone(&store);
        calls.spawn(async move { store.create_conversation(1, user, "a").await });
    }
    let results = calls.join_all().await;
    assert!(
        results.iter().any(|r| r.as_ref().is_err_and(|e| e.0.contains("prepared statement"))),
        "named statements went through a transaction pooler unharmed: {results:?}"
    );
}
