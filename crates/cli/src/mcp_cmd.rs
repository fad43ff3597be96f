//! `toolgraph mcp`: toolgraph as an MCP server on stdio, for an MCP client that starts it (an
//! IDE, a desktop assistant, another agent). Stdout carries the protocol: logs go to stderr.

use anyhow::Context;
use rmcp::ServiceExt;
use std::process::ExitCode;
use toolgraph_config::Config;

pub async fn run(cfg: &Config) -> anyhow::Result<ExitCode> {
    let tools = crate::agent::all_tools(cfg, None).await?;
    // The client that started this process is this machine's user: notes are theirs.
    let export = toolgraph_agents::mcp::export(cfg, tools, crate::retrieval::kb_store(cfg))
        .map_err(anyhow::Error::msg)?
        .with_local_user(crate::agent::LOCAL_USER);
    tracing::info!(tools = %export.tool_names().join(", "), "serving MCP on stdio");
    let service = export.serve(rmcp::transport::stdio()).await.context("the MCP client did not initialize")?;
    // Until the client closes stdin (or the process is stopped).
    let reason = service.waiting().await.context("the MCP session failed")?;
    tracing::info!(?reason, "the MCP session ended");
    Ok(ExitCode::SUCCESS)
}
