//! The `toolgraph` binary: composes the library crates behind one command line.
//!
//! Each subcommand lives in its own module and returns `anyhow::Result`; `main` only parses
//! arguments, loads the configuration, sets up logging and maps errors to an exit code.

mod agent;
mod agents_cmd;
mod allocator;
mod bench_cmd;
mod bench_retention;
mod bench_streams;
mod chat_cmd;
mod config_cmd;
mod cpu;
mod eval_answers;
mod eval_cmd;
mod eval_legal;
mod eval_memory;
mod graph_cmd;
mod guides_cmd;
mod kb_cmd;
mod limits;
mod mcp_cmd;
mod notice;
mod plugins_cmd;
mod reload;
mod remote_chat;
mod retrieval;
mod serve_cmd;
mod terminal;
mod tools_cmd;

use anyhow::Context;

#[global_allocator]
static ALLOCATOR: allocator::CommandAllocator = allocator::CommandAllocator;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use toolgraph_config::Config;

/// toolgraph — a runtime and server for tool-using LLM chat agents.
///
/// Typed tools with human approval of write actions, a checkpointed agent graph, retrieval
/// with citations and a streaming chat service, in one binary. Settings come from
/// toolgraph.toml and TOOLGRAPH_* environment variables (see `toolgraph config show`).
#[derive(Debug, Parser)]
#[command(name = "toolgraph", version, propagate_version = true, max_term_width = 100)]
struct Cli {
    /// Configuration file. Default: ./toolgraph.toml when it exists.
    #[arg(long, global = true, env = "TOOLGRAPH_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,

    /// Data directory (overrides `data_dir` and TOOLGRAPH_DATA_DIR).
    #[arg(long, global = true, value_name = "DIR")]
    data_dir: Option<PathBuf>,

    /// More log output on stderr (-v: debug, -vv: trace). TOOLGRAPH_LOG takes a full filter.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,

    /// How the stderr log is written: `text` for people, `json` (one object per line) for a
    /// log collector.
    #[arg(long, global = true, env = "TOOLGRAPH_LOG_FORMAT", value_enum, default_value_t = LogFormatArg::Text)]
    log_format: LogFormatArg,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List the available tools or call one directly.
    #[command(subcommand)]
    Tools(tools_cmd::ToolsCommand),
    /// Run the chat service (SSE chat, approvals, metrics) until SIGTERM or Ctrl-C.
    Serve(serve_cmd::ServeArgs),
    /// Delete what `server.retention` no longer keeps (idle conversations, old token usage,
    /// expired memory items), once, now.
    Gc(serve_cmd::GcArgs),
    /// Talk to an agent in the terminal (tokens stream; write actions ask y/n).
    Chat(chat_cmd::ChatArgs),
    /// Add files to a knowledge base (md, txt, html, pdf, json, jsonl), incrementally.
    Ingest(kb_cmd::IngestArgs),
    /// Search a knowledge base: keywords (BM25), meaning (dense) or both (hybrid), with metadata filters.
    Search(kb_cmd::SearchArgs),
    /// List or delete knowledge bases.
    #[command(subcommand)]
    Kb(kb_cmd::KbCommand),
    /// Serve the read tools, the documents and the agents' prompts over MCP on stdio.
    Mcp,
    /// Print the OpenAPI document of `toolgraph serve`'s routes (what it serves at
    /// `/openapi.json`), for client generators and API tools.
    Openapi,
    /// List the plugins of the configured (or given) directories, or check them.
    #[command(subcommand)]
    Plugins(plugins_cmd::PluginsCommand),
    /// The course tutor's teaching guides: import JSON guides, show one, list them.
    #[command(subcommand)]
    Guides(guides_cmd::GuidesCommand),
    /// Inspect agent graphs.
    #[command(subcommand)]
    Graph(graph_cmd::GraphCommand),
    /// Check the graphs agents declare in TOML, without starting anything.
    #[command(subcommand)]
    Agents(agents_cmd::AgentsCommand),
    /// Measure quality: retrieval on BEIR-layout data sets.
    #[command(subcommand)]
    Eval(eval_cmd::EvalCommand),
    /// Run a benchmark and print its figures.
    #[command(subcommand)]
    Bench(bench_cmd::BenchCommand),
    /// Inspect the effective configuration.
    #[command(subcommand)]
    Config(config_cmd::ConfigCommand),
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormatArg {
    Text,
    Json,
}

/// The stderr log's filter: `TOOLGRAPH_LOG`, else the one of the verbosity.
fn log_filter(verbose: u8) -> String {
    let default = match verbose {
        // Which plugins loaded, and why one did not, is always worth a line.
        0 => "warn,toolgraph_plugins=info",
        1 => "toolgraph=debug,toolgraph_tools=debug,toolgraph_llm=debug,info",
        _ => "trace",
    };
    std::env::var("TOOLGRAPH_LOG").ok().filter(|f| !f.trim().is_empty()).unwrap_or_else(|| default.to_owned())
}

fn load_config(cli: &Cli) -> anyhow::Result<Config> {
    let default = PathBuf::from("toolgraph.toml");
    let file = cli.config.clone().or_else(|| default.is_file().then_some(default));
    let mut cfg = Config::load(file.as_deref()).context("cannot load the configuration")?;
    if let Some(dir) = &cli.data_dir {
        cfg.data_dir = dir.clone();
    }
    Ok(cfg)
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let cfg = load_config(&cli)?;
    match cli.command {
        Command::Tools(cmd) => tools_cmd::run(cmd, &cfg).await,
        Command::Serve(args) => serve_cmd::run(args, &cfg).await,
        Command::Gc(args) => serve_cmd::gc(args, &cfg).await,
        Command::Chat(args) => chat_cmd::run(args, &cfg).await,
        Command::Ingest(args) => kb_cmd::ingest_cmd(args, &cfg).await,
        Command::Search(args) => kb_cmd::search_cmd(args, &cfg).await,
        Command::Kb(cmd) => kb_cmd::kb_cmd(cmd, &cfg).await,
        Command::Plugins(cmd) => plugins_cmd::run(cmd, &cfg).await,
        Command::Mcp => mcp_cmd::run(&cfg).await,
        Command::Openapi => {
            let document = toolgraph_server::openapi_document().to_pretty_json().context("writing the document")?;
            println!("{document}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Guides(cmd) => guides_cmd::run(cmd, &cfg).await,
        Command::Graph(cmd) => graph_cmd::run(cmd, &cfg).await,
        Command::Agents(cmd) => agents_cmd::run(cmd, &cfg).await,
        Command::Bench(cmd) => bench_cmd::run(cmd).await,
        Command::Eval(cmd) => eval_cmd::run(cmd, &cfg).await,
        Command::Config(cmd) => config_cmd::run(cmd, &cfg),
    }
}

fn main() -> ExitCode {
    if let Err(e) = allocator::check() {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let cli = Cli::parse();
    notice::set_json(cli.log_format == LogFormatArg::Json);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The span exporter runs on the runtime, so it is installed inside it.
    let telemetry = {
        let _inside = runtime.enter();
        use std::io::IsTerminal;
        // The standard variables are often set machine-wide for other programs: a value this
        // binary cannot use stops the service, which the operator means to trace, and is only
        // a warning for every other command.
        let otlp = match toolgraph_telemetry::OtlpOptions::from_env() {
            Ok(o) => o,
            Err(e) if matches!(cli.command, Command::Serve(_)) => {
                notice::error(e);
                return ExitCode::FAILURE;
            }
            Err(e) => {
                notice::warning(format_args!("{e}; spans are not exported"));
                None
            }
        };
        // Colour codes only for a person at a terminal, not for log files and collectors.
        let options = toolgraph_telemetry::TelemetryOptions {
            log_filter: log_filter(cli.verbose),
            ansi: std::io::stderr().is_terminal(),
            format: match cli.log_format {
                LogFormatArg::Text => toolgraph_telemetry::LogFormat::Text,
                LogFormatArg::Json => toolgraph_telemetry::LogFormat::Json,
            },
            otlp,
        };
        match toolgraph_telemetry::install(options) {
            Ok(guard) => guard,
            Err(e) => {
                notice::error(format_args!("{e} (TOOLGRAPH_LOG, OTEL_EXPORTER_OTLP_*, OTEL_ENDPOINT, OTEL_ENABLED)"));
                return ExitCode::FAILURE;
            }
        }
    };
    let code = match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            notice::error(format_args!("{e:#}"));
            ExitCode::FAILURE
        }
    };
    // Spans still queued are exported before the runtime goes.
    telemetry.shutdown();
    code
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    /// The allocator is chosen from the command word before `main`, skipping the global
    /// options' values by a list of their own: that list must name every such option.
    #[test]
    fn the_allocator_knows_every_global_option_that_takes_a_value() {
        let cmd = Cli::command();
        let mut with_value: Vec<String> = cmd
            .get_arguments()
            .filter(|a| a.is_global_set() && a.get_action().takes_values())
            .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
            .collect();
        with_value.sort();
        let mut known: Vec<&str> = allocator::GLOBAL_OPTIONS_WITH_VALUE.to_vec();
        known.sort_unstable();
        assert_eq!(with_value, known);
        assert!(
            cmd.get_arguments()
                .filter(|a| a.is_global_set())
                .all(|a| a.get_short().is_none() || !a.get_action().takes_values()),
            "a short global option with a value is not skipped"
        );
    }
}
