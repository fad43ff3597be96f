//! Helpers shared by the service's end-to-end tests.

use toolgraph_server::AppState;

/// Serves `app` on an ephemeral loopback port in the background; returns `http://127.0.0.1:PORT`.
pub async fn serve(app: AppState) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let router = toolgraph_server::router(app);
    tokio::spawn(async move { axum::serve(listener, router).await });
    base
}
