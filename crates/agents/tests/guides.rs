//! The teaching-guide store on both engines: SQLite (a file) and PostgreSQL (a schema of its
//! own per run, dropped after).

use serde_json::json;
use toolgraph_agents::course::guides::{Guide, GuideStore, Upserted};

async fn exercise(store: &GuideStore) {
    let mut guide = Guide::from_json(json!({
        "subject": "iv", "asignatura": "Infraestructura Virtual",
        "competencias": {"generales": ["CG1"]}, "objetivos": ["Desplegar en la nube"]
    }))
    .unwrap();
    assert_eq!(store.upsert("ugr", &guide).await.unwrap(), Upserted::Inserted);
    assert_eq!(store.upsert("ugr", &guide).await.unwrap(), Upserted::Unchanged, "importing twice changes nothing");
    guide.doc["objetivos"] = json!(["Desplegar en la nube", "Automatizar las pruebas"]);
    assert_eq!(store.upsert("ugr", &guide).await.unwrap(), Upserted::Updated);
    let doc = store.get("ugr", "iv").await.unwrap().unwrap();
    assert_eq!(doc["objetivos"][1], "Automatizar las pruebas");
    assert_eq!(doc["competencias"]["generales"], json!(["CG1"]), "unicode keys and nesting survive");
    assert_eq!(store.get("ugr", "dai").await.unwrap(), None);
    assert_eq!(store.get("otra", "iv").await.unwrap(), None, "another tenant's guides are apart");
    let dai = Guide::from_json(json!({"subject": "dai", "asignatura": "DAI"})).unwrap();
    store.upsert("ugr", &dai).await.unwrap();
    assert_eq!(store.subjects("ugr").await.unwrap(), ["dai", "iv"]);
}

#[tokio::test]
async fn guides_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    exercise(&GuideStore::open_sqlite(&dir.path().join("guides.db")).await.unwrap()).await;
}

#[tokio::test]
async fn guides_on_postgres() {
    let Some(schema) = toolgraph_testkit::PgSchema::create().await else { return };
    exercise(&GuideStore::open_postgres_with(schema.options()).await.unwrap()).await;
}
