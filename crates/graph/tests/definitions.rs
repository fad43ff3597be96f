//! A graph version's definition is kept by every store, survives reopening it, and is never
//! replaced: a version names one definition.

use toolgraph_graph::{Checkpointer, MemoryCheckpointer, SqliteCheckpointer};

async fn keeps_the_first_definition_of_each_version(store: &dyn Checkpointer) {
    assert_eq!(store.definition("a1b2c3").await.unwrap(), None, "nothing kept yet");
    store.keep_definition("a1b2c3", "{\"own\":\"first\"}").await.unwrap();
    store.keep_definition("d4e5f6", "{\"own\":\"other\"}").await.unwrap();
    // Kept again (a second replica starting, a reload back to it): the first stays.
    store.keep_definition("a1b2c3", "{\"own\":\"second\"}").await.unwrap();
    assert_eq!(store.definition("a1b2c3").await.unwrap().as_deref(), Some("{\"own\":\"first\"}"));
    assert_eq!(store.definition("d4e5f6").await.unwrap().as_deref(), Some("{\"own\":\"other\"}"));
    assert_eq!(store.definition("ffffff").await.unwrap(), None);
}

#[tokio::test]
async fn memory_keeps_definitions() {
    keeps_the_first_definition_of_each_version(&MemoryCheckpointer::new()).await;
}

#[tokio::test]
async fn sqlite_keeps_definitions_across_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    keeps_the_first_definition_of_each_version(&SqliteCheckpointer::open(&path).await.unwrap()).await;
    let reopened = SqliteCheckpointer::open(&path).await.unwrap();
    assert_eq!(reopened.definition("a1b2c3").await.unwrap().as_deref(), Some("{\"own\":\"first\"}"));
}

#[tokio::test]
async fn postgres_keeps_definitions() {
    let Some(schema) = toolgraph_testkit::PgSchema::create().await else { return };
    let store = schema.checkpointer().await;
    keeps_the_first_definition_of_each_version(&store).await;
    store.pool().close().await;
}
