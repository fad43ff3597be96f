//! `toolgraph tools`: list the built-in tools and call one directly.
//!
//! Calling a write tool asks for approval on the terminal first, the same decision an agent
//! run would ask a person for; `--yes` approves non-interactively.

use anyhow::{Context, bail};
use clap::Subcommand;
use serde_json::{Map, Value};
use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use toolgraph_config::Config;
use toolgraph_tools::{ToolClass, ToolContext, ToolRegistry};

#[derive(Debug, Subcommand)]
pub enum ToolsCommand {
    /// List tools with their class and argument schema.
    List {
        /// Print a JSON array of tool specs (name, class, description, parameters, display text).
        #[arg(long)]
        json: bool,
    },
    /// Call one tool and print its outcome as JSON (exit status 1 if the outcome is a failure).
    Call {
        /// Tool name, as `tools list` shows it.
        name: String,
        /// Arguments as a JSON object.
        #[arg(long, default_value = "{}", value_name = "JSON")]
        args: String,
        /// A state value for injected arguments, e.g. `--state asignatura=iv` (repeatable).
        #[arg(long = "state", value_name = "KEY=VALUE")]
        state: Vec<String>,
        /// Approve a write tool without asking.
        #[arg(long, short = 'y')]
        yes: bool,
    },
}

pub async fn run(cmd: ToolsCommand, cfg: &Config) -> anyhow::Result<ExitCode> {
    let registry = crate::agent::all_tools(cfg, None).await.context("cannot assemble the built-in tools")?;
    match cmd {
        ToolsCommand::List { json } => {
            list(&registry, json)?;
            Ok(ExitCode::SUCCESS)
        }
        ToolsCommand::Call { name, args, state, yes } => {
            // The local identity, unless `--state` names another.
            let mut ctx = crate::agent::local_identity(cfg);
            ctx.extend(parse_state(&state)?);
            call(&registry, &name, &args, ctx, yes).await
        }
    }
}

fn list(registry: &ToolRegistry, json: bool) -> anyhow::Result<()> {
    if json {
        let specs = registry.specs();
        println!("{}", serde_json::to_string_pretty(&specs)?);
        return Ok(());
    }
    for spec in registry.specs() {
        let class = match spec.class {
            ToolClass::Read => "read",
            ToolClass::Write => "write (asks for approval)",
        };
        println!("{}  [{}]\n    {}", spec.name, class, spec.description);
        let required: Vec<&str> = spec.parameters["required"]
            .as_array()
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if let Some(props) = spec.parameters["properties"].as_object() {
            for (param, schema) in props {
                let ty = schema.get("type").map(|t| t.to_string().replace('"', "")).unwrap_or_else(|| "any".into());
                let req = if required.contains(&param.as_str()) { "required" } else { "optional" };
                let doc = schema.get("description").and_then(Value::as_str).unwrap_or("");
                println!("      --{param} ({ty}, {req}) {}", doc.lines().next().unwrap_or(""));
            }
        }
        println!();
    }
    Ok(())
}

fn parse_state(pairs: &[String]) -> anyhow::Result<Map<String, Value>> {
    let mut state = Map::new();
    for pair in pairs {
        let Some((k, v)) = pair.split_once('=') else { bail!("--state expects KEY=VALUE, got '{pair}'") };
        // A JSON value if it parses (numbers, booleans, objects), else the plain string.
        let value = serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_owned()));
        state.insert(k.to_owned(), value);
    }
    Ok(state)
}

async fn call(
    registry: &ToolRegistry,
    name: &str,
    args: &str,
    state: Map<String, Value>,
    yes: bool,
) -> anyhow::Result<ExitCode> {
    let arguments: Value = serde_json::from_str(args).with_context(|| format!("--args is not valid JSON: {args}"))?;
    let ctx = ToolContext::with_state(state);
    if let Some(tool) = registry.get(name)
        && tool.spec().class == ToolClass::Write
        && !yes
    {
        let mut effective = arguments.clone();
        if let Value::Object(m) = &mut effective {
            for k in &tool.spec().injected {
                if let Some(v) = ctx.get(k) {
                    m.insert(k.clone(), v.clone());
                }
            }
        }
        let description = tool.describe(&effective);
        if !approve(name, &description).await? {
            eprintln!("not approved: '{name}' was not run");
            return Ok(ExitCode::FAILURE);
        }
    }
    let outcome = registry.call(&ctx, name, &arguments).await;
    println!("{}", serde_json::to_string_pretty(&outcome)?);
    Ok(if outcome.is_success() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Asks on the terminal; without one, refuses and says how to approve.
async fn approve(name: &str, description: &str) -> anyhow::Result<bool> {
    if !std::io::stdin().is_terminal() {
        bail!("'{name}' is a write tool and needs approval: {description}. Pass --yes to approve without a terminal");
    }
    let prompt = format!("'{name}' wants to: {description}\nApprove? [y/N] ");
    tokio::task::spawn_blocking(move || -> anyhow::Result<bool> {
        let mut err = std::io::stderr();
        err.write_all(prompt.as_bytes())?;
        err.flush()?;
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line)?;
        Ok(matches!(line.trim(), "y" | "Y" | "yes" | "YES" | "Yes"))
    })
    .await
    .context("the approval prompt failed")?
}
