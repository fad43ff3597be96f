//! `toolgraph serve` with `auth = "hmac"` on PostgreSQL: the replicas share the nonces of the
//! signed requests they accepted (docs/service.md, "Signed requests"), so a captured request
//! accepted by one replica is refused by another, and by a replica that restarted.

mod common;
use common::{free_port, serve_command, wait_ready};

use scripted_llm::ScriptedModelServer;
use std::process::{Child, Stdio};
use toolgraph_server::auth::{SignedRequest, signature_headers};
use toolgraph_testkit::PgSchema;

const SECRET: &str = "the-callers-secret-of-32-bytes-x";

/// A replica; killed when dropped.
struct Replica(Child, String);

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn replica(schema: &PgSchema, model: &ScriptedModelServer, dir: &std::path::Path) -> Replica {
    let server = schema.options();
    let (user, db) = (server.get_username(), server.get_database().unwrap_or("postgres"));
    let (host, pg_port) = (server.get_host(), server.get_port());
    let url = format!("postgres://{user}@{host}:{pg_port}/{db}?options=-c%20search_path%3D{}", schema.name);
    let port = free_port();
    let child = serve_command(dir, model, port)
        .env("TOOLGRAPH_DATABASE_URL", url)
        .env("TOOLGRAPH_SERVER_AUTH", "hmac")
        .env("TOOLGRAPH_SERVER_HMAC_SECRET", SECRET)
        .env("TOOLGRAPH_SERVER_INSTANCE_ID", format!("replica-{port}"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    wait_ready(&base).await;
    Replica(child, base)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_request_is_accepted_once_across_replicas_and_restarts() {
    let Some(schema) = PgSchema::create().await else { return };
    let model = ScriptedModelServer::start(vec![]).await.unwrap();
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = replica(&schema, &model, dir_a.path()).await;
    let b = replica(&schema, &model, dir_b.path()).await;

    let target = "/api/chatbot/conversations?tenantId=7&userId=101";
    let signed = SignedRequest { method: "GET", target, tenant_slug: Some("demo"), body: b"" };
    let headers = signature_headers(SECRET.as_bytes(), &signed);
    let send = |base: &str| {
        let mut req = reqwest::Client::new().get(format!("{base}{target}")).header("x-tenant-slug", "demo");
        for (name, value) in &headers {
            req = req.header(*name, value);
        }
        async move {
            let resp = req.send().await.unwrap();
            (resp.status().as_u16(), resp.text().await.unwrap_or_default())
        }
    };
    let (status, text) = send(&a.1).await;
    assert_eq!(status, 200, "{text}");
    let (status, text) = send(&b.1).await;
    assert_eq!((status, text.contains("replayed")), (401, true), "another replica accepted it: {text}");
    drop(a);
    let restarted = replica(&schema, &model, dir_a.path()).await;
    let (status, text) = send(&restarted.1).await;
    assert_eq!((status, text.contains("replayed")), (401, true), "a restarted replica accepted it: {text}");
}
