//! Loading and validating the configuration: sources, keys, origins in errors.
// figment::Jail's closures return figment::Error; its size is not ours to choose.
#![allow(clippy::result_large_err)]

use crate::*;
use figment::Jail;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use toolgraph_llm::Provider;

#[test]
fn defaults_are_sane() {
    let c = Config::default();
    assert_eq!(c.data_dir, PathBuf::from("./.toolgraph"));
    assert_eq!(c.llm.max_retries, 3);
    assert!(c.llm.base_url.is_none());
    assert_eq!(c.llm.local_cache_slots, 4);
    assert_eq!(c.llm.local_draft_tokens, 15);
}

#[test]
fn file_then_environment_override() {
    Jail::expect_with(|jail| {
        jail.create_file(
            "toolgraph.toml",
            "data_dir = \"/tmp/tg\"\n[llm]\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"from-file\"\nmax_retries = 1\n",
        )?;
        jail.set_env("TOOLGRAPH_LLM_MODEL", "from-env");
        jail.set_env("TOOLGRAPH_LLM_API_KEY", "sk-secret-123");
        jail.set_env("TOOLGRAPH_LLM__IDLE_TIMEOUT_MS", "1234");
        let c = Config::load(Some(Path::new("toolgraph.toml"))).map_err(|e| e.to_string())?;
        assert_eq!(c.data_dir, PathBuf::from("/tmp/tg"));
        assert_eq!(c.llm.model, "from-env");
        assert_eq!(c.llm.max_retries, 1);
        assert_eq!(c.llm.idle_timeout_ms, 1234);
        assert_eq!(c.llm.api_key.as_ref().map(Secret::expose), Some("sk-secret-123"));
        let shown = c.to_masked_toml();
        assert!(!shown.contains("sk-secret-123"), "{shown}");
        assert!(shown.contains("api_key = \"********\""), "{shown}");
        Ok(())
    });
}

#[test]
fn the_documented_environment_names_reach_their_keys() {
    Jail::expect_with(|jail| {
        jail.create_file("toolgraph.toml", "[agents.tutor]\nsystem_prompt = \"x\"\n")?;
        jail.set_env("TOOLGRAPH_AGENTS__TUTOR__MODEL", "qwen2.5");
        jail.set_env("TOOLGRAPH_SERVER_OPS_BIND", "127.0.0.1:9100");
        jail.set_env("TOOLGRAPH_SERVER_MAX_RUNS_PER_TENANT", "5");
        jail.set_env("TOOLGRAPH_SERVER_MAX_REQUEST_HEAD_BYTES", "16384");
        jail.set_env("TOOLGRAPH_SERVER_HEADER_READ_TIMEOUT_MS", "2500");
        jail.set_env("TOOLGRAPH_SERVER_SHUTDOWN_DRAIN_MS", "1500");
        jail.set_env("TOOLGRAPH_SERVER__API_KEYS__DEMO", "ab".repeat(32));
        jail.set_env("TOOLGRAPH_SERVER__API_KEY_TENANTS__DEMO", "7");
        jail.set_env("TOOLGRAPH_TOOLS_SQL_DATABASE", "sqlite::memory:");
        jail.set_env("TOOLGRAPH_RAG_DEFAULT_KB", "cursos");
        jail.set_env("TOOLGRAPH_RAG_TENANT", "ugr");
        jail.set_env("TOOLGRAPH_RAG_FUSION", "dbsf");
        jail.set_env("TOOLGRAPH_LLM_LOCAL_CACHE_SLOTS", "2");
        jail.set_env("TOOLGRAPH_LLM_LOCAL_DRAFT_TOKENS", "0");
        jail.set_env("TOOLGRAPH_MCP_HTTP", "true");
        jail.set_env("TOOLGRAPH_MCP_APPROVAL_KEY", "k".repeat(32));
        jail.set_env("TOOLGRAPH_SERVER_WRITE_TIMEOUT_MS", "5000");
        jail.set_env("TOOLGRAPH_SERVER_MAX_CONNECTIONS", "100");
        jail.set_env("TOOLGRAPH_SERVER_ALLOW_UNBOUND_API_KEYS", "true");
        let c = Config::load(Some(Path::new("toolgraph.toml"))).map_err(|e| e.to_string())?;
        assert!(c.mcp.http && c.server.allow_unbound_api_keys);
        assert_eq!(c.mcp.approval_key.as_ref().map(|k| k.expose().len()), Some(32));
        assert_eq!((c.server.write_timeout_ms, c.server.max_connections), (5000, 100));
        assert_eq!(c.llm.local_cache_slots, 2);
        assert_eq!(c.llm.local_draft_tokens, 0);
        assert_eq!((c.rag.default_kb.as_str(), c.rag.tenant.as_str()), ("cursos", "ugr"));
        assert_eq!(c.rag.fusion, FusionMethod::Dbsf);
        jail.set_env("TOOLGRAPH_RAG_SECOND_EMBEDDING", "minilm");
        let with_second = Config::load(Some(Path::new("toolgraph.toml"))).map_err(|e| e.to_string())?;
        assert_eq!(with_second.rag.second_embedding, SecondEmbedding::Minilm);
        assert_eq!(with_second.rag.second_embedding_languages, ["en"]);
        jail.set_env("TOOLGRAPH_RAG_SECOND_EMBEDDING", "none");
        jail.set_env("TOOLGRAPH_RAG_FUSION", "borda");
        let err = Config::load(Some(Path::new("toolgraph.toml"))).unwrap_err().to_string();
        assert!(err.contains("borda") && err.contains("rrf") && err.contains("dbsf"), "{err}");
        assert_eq!(c.agents["tutor"].model.as_deref(), Some("qwen2.5"));
        assert_eq!(c.server.ops_bind.as_deref(), Some("127.0.0.1:9100"));
        assert_eq!(c.server.max_runs_per_tenant, 5);
        assert_eq!((c.server.max_request_head_bytes, c.server.header_read_timeout_ms), (16384, 2500));
        assert_eq!(c.server.shutdown_drain_ms, 1500);
        assert_eq!(c.server.api_keys["demo"], "ab".repeat(32));
        assert_eq!(c.server.api_key_tenants["demo"], 7);
        assert_eq!(c.tools.sql_database.as_deref(), Some("sqlite::memory:"));
        Ok(())
    });
}

#[test]
fn unknown_keys_name_the_file_and_the_key() {
    Jail::expect_with(|jail| {
        jail.create_file("toolgraph.toml", "[llm]\nmodle = \"x\"\n")?;
        let err = Config::load(Some(Path::new("toolgraph.toml"))).unwrap_err().to_string();
        assert!(err.contains("modle"), "{err}");
        assert!(err.contains("toolgraph.toml"), "{err}");
        Ok(())
    });
}

#[test]
fn unknown_environment_keys_are_refused() {
    Jail::expect_with(|jail| {
        jail.set_env("TOOLGRAPH_LLM_BASEURL", "http://x");
        let err = Config::load(None).unwrap_err().to_string();
        assert!(err.contains("baseurl"), "{err}");
        assert!(err.to_lowercase().contains("environment"), "{err}");
        Ok(())
    });
}

#[test]
fn an_unknown_key_close_to_a_known_one_is_named_with_a_did_you_mean() {
    let err = Config::from_toml_str("[llm]\nbase_ur = \"http://x\"\n").unwrap_err().to_string();
    assert!(err.contains("did you mean `llm.base_url`?"), "{err}");
    let err = Config::from_toml_str("[tools.course]\nbackend-url = \"http://x\"\n").unwrap_err().to_string();
    assert!(err.contains("did you mean `tools.course.backend_url`?"), "{err}");
    let err = Config::from_toml_str("[rag]\nbackend = \"qdrnt\"\n").unwrap_err().to_string();
    assert!(err.contains("did you mean \"qdrant\"?"), "{err}");
    // Nothing close: the list of known keys alone, no guess.
    let err = Config::from_toml_str("[llm]\ncolour = \"red\"\n").unwrap_err().to_string();
    assert!(err.contains("colour") && !err.contains("did you mean"), "{err}");
    Jail::expect_with(|jail| {
        jail.set_env("TOOLGRAPH_LLM_BASEURL", "http://x");
        let err = Config::load(None).unwrap_err().to_string();
        assert!(err.contains("did you mean `llm.base_url` (TOOLGRAPH_LLM_BASE_URL)?"), "{err}");
        Ok(())
    });
}

#[test]
fn the_variable_named_for_a_key_sets_that_key() {
    for key in [
        "data_dir",
        "llm.base_url",
        "server.port",
        "tools.course.backend_url",
        "agents.course_tutor.model",
        "agents.tutor.grounding",
        "rag.kb.cursos.embedding",
    ] {
        let variable = key_variable(key);
        assert_eq!(variable_key(&variable).as_deref(), Some(key), "{variable}");
    }
}

#[test]
fn wrong_types_name_the_key() {
    let err = Config::from_toml_str("[llm]\nmax_retries = \"many\"\n").unwrap_err().to_string();
    assert!(err.contains("max_retries"), "{err}");
}

#[test]
fn bad_values_name_the_key_the_origin_and_the_reason() {
    Jail::expect_with(|jail| {
        jail.set_env("TOOLGRAPH_LLM_BASE_URL", "ftp://example.org");
        jail.set_env("TOOLGRAPH_LLM_MODEL", "m");
        let err = Config::load(None).unwrap_err().to_string();
        assert!(err.contains("`llm.base_url`"), "{err}");
        assert!(err.contains("TOOLGRAPH_"), "{err}");
        assert!(err.contains("not http or https"), "{err}");
        Ok(())
    });
    let err = Config::from_toml_str("[llm]\nbase_url = \"http://h/v1\"\n").unwrap_err().to_string();
    assert!(err.contains("`llm.model`") && err.contains("required"), "{err}");
    let err = Config::from_toml_str("[llm]\nidle_timeout_ms = 0\n").unwrap_err().to_string();
    assert!(err.contains("greater than 0"), "{err}");
    let err = Config::from_toml_str("[llm]\nlocal_cache_slots = 0\n").unwrap_err().to_string();
    assert!(err.contains("`llm.local_cache_slots`") && err.contains("not 1-64"), "{err}");
    let err = Config::from_toml_str("[llm]\nlocal_draft_tokens = 33\n").unwrap_err().to_string();
    assert!(err.contains("`llm.local_draft_tokens`") && err.contains("not 0-32"), "{err}");
    let err = Config::from_toml_str("database_url = \"mysql://x\"\n").unwrap_err().to_string();
    assert!(err.contains("postgres://"), "{err}");
    let pooled = "database_url = \"postgres://pgbouncer:6432/app\"\ndatabase_pooling = \"transaction\"\n";
    let err = Config::from_toml_str(pooled).unwrap_err().to_string();
    assert!(err.contains("`database_migration_url`") && err.contains("session lock"), "{err}");
    let ok = Config::from_toml_str(&format!("{pooled}database_migration_url = \"postgres://db:5432/app\"\n")).unwrap();
    assert_eq!(ok.database_pooling, crate::DatabasePooling::Transaction);
    let err = Config::from_toml_str("database_pooling = \"transaction\"\n").unwrap_err().to_string();
    assert!(err.contains("needs database_url"), "{err}");
    let err = Config::from_toml_str("database_pooling = \"statement\"\n").unwrap_err().to_string();
    assert!(err.contains("statement"), "{err}");
    let err = Config::from_toml_str("[server]\nmax_request_head_bytes = 4096\n").unwrap_err().to_string();
    assert!(err.contains("`server.max_request_head_bytes`") && err.contains("8192..=1048576"), "{err}");
    let err = Config::from_toml_str("[server]\nheader_read_timeout_ms = 0\n").unwrap_err().to_string();
    assert!(err.contains("`server.header_read_timeout_ms`") && err.contains("greater than 0"), "{err}");
    let err = Config::from_toml_str("[server]\nshutdown_drain_ms = 0\n").unwrap_err().to_string();
    assert!(err.contains("`server.shutdown_drain_ms`") && err.contains("greater than 0"), "{err}");
    let err = Config::from_toml_str("[plugins]\nlocale = \"../x\"\n").unwrap_err().to_string();
    assert!(err.contains("`plugins.locale`"), "{err}");
    let c = Config::from_toml_str("[plugins]\ndirs = [\"plugins\", \"/opt/tg\"]\nlocale = \"es\"\n").unwrap();
    assert_eq!(c.plugins.dirs, [PathBuf::from("plugins"), PathBuf::from("/opt/tg")]);
    let hmac = "[server]\nauth = \"hmac\"\nhmac_secret = \"a-secret-of-at-least-32-bytes-xyz\"\n";
    assert!(!Config::from_toml_str(hmac).unwrap().mcp.http, "/mcp is off by default");
    let err = Config::from_toml_str(&format!("{hmac}[mcp]\nhttp = true\n")).unwrap_err().to_string();
    assert!(err.contains("`mcp.http`") && err.contains("api_key"), "{err}");
    let err = Config::from_toml_str("[mcp]\napproval_key = \"too-short\"\n").unwrap_err().to_string();
    assert!(err.contains("`mcp.approval_key`") && err.contains("32 bytes"), "{err}");
    let c = Config::from_toml_str(&format!("[mcp]\napproval_key = \"{}\"\n", "k".repeat(32))).unwrap();
    assert_eq!(c.mcp.approval_key.as_ref().map(|k| k.expose().len()), Some(32));
    assert!(!c.to_masked_toml().contains(&"k".repeat(32)), "the key is masked");
    let err = Config::from_toml_str("[server]\nallowed_hosts = []\n").unwrap_err().to_string();
    assert!(err.contains("`server.allowed_hosts`"), "{err}");
    assert_eq!(Config::default().server.allowed_hosts, ["localhost", "127.0.0.1", "::1"]);
    let text = "[mcp]\nhttp = true\nwrite_tools = [\"note_write\"]\n[server]\nallowed_hosts = [\"tg.example.com\"]\n";
    let c = Config::from_toml_str(text).unwrap();
    assert_eq!(
        (c.mcp.http, c.server.allowed_hosts.as_slice(), c.mcp.write_tools.as_slice()),
        (true, ["tg.example.com".to_string()].as_slice(), ["note_write".to_string()].as_slice())
    );
    assert_eq!(Config::default().tools.course, None, "the course tools are off by default");
    let c = Config::from_toml_str("[tools.course]\n").unwrap();
    assert_eq!(c.tools.course, Some(Default::default()), "the table alone turns them on");
    let err = Config::from_toml_str("[tools.course]\nbackend_url = \"backend:80\"\n").unwrap_err().to_string();
    assert!(err.contains("`tools.course.backend_url`"), "{err}");
    let err = Config::from_toml_str("[server]\nreload_poll_ms = 5\n").unwrap_err().to_string();
    assert!(err.contains("`server.reload_poll_ms`") && err.contains("less than 100"), "{err}");
    assert!(Config::from_toml_str("[server]\nreload_poll_ms = 0\n").is_ok(), "0 turns looking off");
    let err = Config::from_toml_str("[server]\nturn_lease_ms = 10\n").unwrap_err().to_string();
    assert!(err.contains("`server.turn_lease_ms`") && err.contains("less than 1000"), "{err}");
    let err = Config::from_toml_str("[rag]\nbackend = \"qdrant\"\n").unwrap_err().to_string();
    assert!(err.contains("`rag.backend`") && err.contains("needs qdrant_url"), "{err}");
    let err = Config::from_toml_str("qdrant_url = \"qdrant:6333\"\n").unwrap_err().to_string();
    assert!(err.contains("`qdrant_url`") && err.contains("http(s) URL"), "{err}");
    let c = Config::from_toml_str("qdrant_url = \"http://q:6333\"\n[rag]\nbackend = \"qdrant\"\n").unwrap();
    assert_eq!((c.rag.backend, c.qdrant_url.as_deref()), (crate::KbBackend::Qdrant, Some("http://q:6333")));
    let err = Config::from_toml_str("[server]\nrun_events = \"postgres\"\n").unwrap_err().to_string();
    assert!(err.contains("`server.run_events`") && err.contains("needs database_url"), "{err}");
    let c = Config::from_toml_str("database_url = \"postgres://db/x\"\n[server]\nrun_events = \"process\"\n").unwrap();
    assert_eq!(c.server.run_events, crate::RunEventsKind::Process);
    let err = Config::from_toml_str("[server]\nitem_search = \"hybrid\"\n[rag]\nembedding = \"none\"\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("`server.item_search`") && err.contains("rag.embedding"), "{err}");
    let c = Config::from_toml_str("[server]\nitem_search = \"hybrid\"\n").unwrap();
    assert_eq!(c.server.item_search, crate::ItemSearchKind::Hybrid);
    assert_eq!(Config::from_toml_str("").unwrap().server.item_search, crate::ItemSearchKind::Keyword);
    let err = Config::from_toml_str("[server]\nitem_search = \"semantic\"\n").unwrap_err().to_string();
    assert!(err.contains("item_search"), "{err}");
    let err = Config::from_toml_str("[server]\ninstance_id = \" \"\n").unwrap_err().to_string();
    assert!(err.contains("`server.instance_id`"), "{err}");
    let err =
        Config::from_toml_str("[rag]\nembedding = \"none\"\nsecond_embedding = \"minilm\"\n").unwrap_err().to_string();
    assert!(err.contains("`rag.second_embedding`") && err.contains("needs a first one"), "{err}");
    let err = Config::from_toml_str("[rag]\nsecond_embedding = \"minilm\"\nsecond_embedding_languages = [\"fr\"]\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("`rag.second_embedding_languages`") && err.contains("'fr'"), "{err}");
    let err = Config::from_toml_str("[agents.a]\nmax_tokens = 0\n").unwrap_err().to_string();
    assert!(err.contains("`agents.a.max_tokens`") && err.contains("greater than 0"), "{err}");
    let err = Config::from_toml_str("[agents.a]\nkb = \"../leyes\"\n").unwrap_err().to_string();
    assert!(err.contains("`agents.a.kb`") && err.contains("letters, digits"), "{err}");
    let c = Config::from_toml_str("[agents.a]\nkb = \"leyes\"\n").unwrap();
    assert_eq!(c.agents["a"].kb.as_deref(), Some("leyes"));
    let c = Config::from_toml_str("[agents.a]\nmax_tokens = 300\n").unwrap();
    assert_eq!(c.agents["a"].max_tokens, Some(300));
    for bad in ["-0.5", "nan", "inf", "10.5"] {
        let err = Config::from_toml_str(&format!("[agents.a]\nmin_question_gain = {bad}\n")).unwrap_err().to_string();
        assert!(err.contains("`agents.a.min_question_gain`") && err.contains("from 0 (off) to 10"), "{bad}: {err}");
    }
    let c = Config::from_toml_str("[agents.a]\nmin_question_gain = 0.8\n").unwrap();
    assert_eq!(c.agents["a"].min_question_gain, Some(0.8));
    assert_eq!(Config::from_toml_str("[agents.a]\n").unwrap().agents["a"].min_question_gain, None, "the default's");
}

#[test]
fn memory_and_older_turns_are_checked_naming_the_key() {
    let refused = |toml: &str| Config::from_toml_str(toml).unwrap_err().to_string();
    let err = refused("[agents.a.memory]\nrecall = 21\n");
    assert!(err.contains("`agents.a.memory.recall`") && err.contains("at most 20"), "{err}");
    let err = refused("[agents.a.memory]\nnamespace = [\"memories\", \"a.b\"]\n");
    assert!(err.contains("`agents.a.memory.namespace`"), "{err}");
    let err = refused("[agents.a.memory]\nnamespace = []\n");
    assert!(err.contains("`agents.a.memory.namespace`"), "{err}");
    let err = refused("[agents.a.memory]\nttl_days = 0\n");
    assert!(err.contains("`agents.a.memory.ttl_days`"), "{err}");
    let err = refused("[agents.a.memory]\ntools = false\nrecall = 0\n");
    assert!(err.contains("neither remembers nor recalls"), "{err}");
    let err = refused("[agents.a]\ngraph = \"legal_pipeline\"\n[agents.a.memory]\n");
    assert!(err.contains("`agents.a.memory`") && err.contains("legal_pipeline"), "{err}");
    let err = refused("[agents.a.memory]\nremember = true\n");
    assert!(err.contains("remember"), "{err}");
    let err = refused("[agents.a]\nhistory_budget = 0\nolder_turns = \"summarise\"\n");
    assert!(err.contains("`agents.a.older_turns`") && err.contains("history_budget"), "{err}");
    let err = refused("[agents.a]\ngraph = \"crisis_companion\"\nolder_turns = \"summarise\"\n");
    assert!(err.contains("`agents.a.older_turns`") && err.contains("crisis_companion"), "{err}");
    let err = refused("[agents.a]\nolder_turns = \"forget\"\n");
    assert!(err.contains("older_turns") || err.contains("forget"), "{err}");

    let c = Config::from_toml_str("[agents.a]\nolder_turns = \"summarise\"\n[agents.a.memory]\n").unwrap();
    let memory = c.agents["a"].memory.clone().unwrap();
    assert_eq!((memory.tools, memory.approve_writes, memory.recall, memory.namespace), (true, false, 5, None));
    assert_eq!(c.agents["a"].older_turns, crate::OlderTurns::Summarise);
    assert!(Config::from_toml_str("[agents.a]\n").unwrap().agents["a"].memory.is_none());
}

#[test]
fn token_budgets_and_retention_are_checked_naming_the_key() {
    let refused = |toml: &str| Config::from_toml_str(toml).unwrap_err().to_string();
    let err = refused("[server.token_budget.tenants]\nacme = 10\n");
    assert!(err.contains("`server.token_budget.tenants.acme`") && err.contains("tenant id"), "{err}");
    let err = refused("[server.token_budget]\nperiod = \"week\"\n");
    assert!(err.contains("week") || err.contains("period"), "{err}");
    let err = refused("[server.retention.tenants.0]\nconversation_idle_days = 3\n");
    assert!(err.contains("`server.retention.tenants.0`"), "{err}");
    let err = refused("[server.retention.agents.nobody]\nconversation_idle_days = 3\n");
    assert!(err.contains("`server.retention.agents.nobody`") && err.contains("no agent"), "{err}");
    let err = refused("[server.retention]\nevery_minutes = 0\n");
    assert!(err.contains("`server.retention.every_minutes`"), "{err}");
    let backend =
        "[server]\nstore = \"backend\"\nbackend_url = \"http://b:8080\"\nbackend_hmac_secret = \"0123456789abcdef\"\n";
    let err = refused(&format!("{backend}[server.token_budget]\ntokens = 1000\n"));
    assert!(err.contains("`server.token_budget`") && err.contains("backend"), "{err}");
    let err = refused(&format!("{backend}[server.retention]\nconversation_idle_days = 30\n"));
    assert!(err.contains("`server.retention`") && err.contains("backend"), "{err}");
    // A backend store without either is fine; so are zeros, which keep everything.
    Config::from_toml_str(&format!("{backend}[server.token_budget.tenants]\n7 = 0\n")).unwrap();

    let c = Config::from_toml_str(
        "[agents.tutor]\n[server.token_budget]\ntokens = 1000\nperiod = \"day\"\n[server.token_budget.tenants]\n7 = 50\n\
         [server.retention]\nconversation_idle_days = 90\n[server.retention.tenants.7]\nconversation_idle_days = 7\n\
         [server.retention.agents.tutor]\nconversation_idle_days = 30\n",
    )
    .unwrap();
    assert_eq!(c.server.token_budget.period, crate::BudgetPeriodKind::Day);
    assert_eq!(c.server.token_budget.tenant_budgets(), BTreeMap::from([(7, 50)]));
    let tenants = c.server.retention.tenant_overrides();
    assert_eq!(tenants.keys().copied().collect::<Vec<_>>(), [7]);
    assert_eq!((tenants[&7].conversation_idle_days, tenants[&7].keep_checkpoints), (Some(7), None));
    assert_eq!(c.server.retention.agents["tutor"].conversation_idle_days, Some(30));
    assert_eq!(c.server.retention.every_minutes, 60);
    assert!(c.server.retention.is_set() && c.server.token_budget.is_set());
    assert!(!Config::default().server.retention.is_set() && !Config::default().server.token_budget.is_set());
    // An override may set either; what it leaves out follows the next rule.
    let c = Config::from_toml_str("[server.retention.tenants.7]\nkeep_checkpoints = 20\n").unwrap();
    let seven = &c.server.retention.tenants["7"];
    assert_eq!((seven.conversation_idle_days, seven.keep_checkpoints), (None, Some(20)));
    assert!(c.server.retention.is_set());
    assert!(Config::from_toml_str("[server.retention]\nkeep_checkpoints = 10\n").unwrap().server.retention.is_set());
    let err = refused("[server.retention.tenants.7]\nkeep = 20\n");
    assert!(err.contains("keep"), "{err}");
}

#[test]
fn backend_tools_are_declared_with_a_description_and_a_schema() {
    let backend =
        "[server]\nstore = \"backend\"\nbackend_url = \"http://b:8080\"\nbackend_hmac_secret = \"0123456789abcdef\"\n";
    let tool = "[server.backend_tools.send_sms]\ndescription = \"Send an SMS.\"\nparameters = { type = \"object\", properties = { text = { type = \"string\" } }, required = [\"text\"] }\n";
    let c = Config::from_toml_str(&format!("{backend}{tool}")).unwrap();
    let sms = &c.server.backend_tools["send_sms"];
    assert_eq!(sms.parameters["properties"]["text"]["type"], "string");
    assert_eq!(sms.parameters["required"][0], "text");
    let err = Config::from_toml_str(tool).unwrap_err().to_string();
    assert!(err.contains("server.backend_tools.send_sms") && err.contains("store = \"backend\""), "{err}");
    let blank = tool.replace("Send an SMS.", " ");
    let err = Config::from_toml_str(&format!("{backend}{blank}")).unwrap_err().to_string();
    assert!(err.contains("server.backend_tools.send_sms.description"), "{err}");
}

#[test]
fn the_backend_store_needs_its_url_and_secret() {
    let err = Config::from_toml_str("[server]\nstore = \"backend\"\n").unwrap_err().to_string();
    assert!(err.contains("`server.backend_url`"), "{err}");
    let err = Config::from_toml_str("[server]\nstore = \"backend\"\nbackend_url = \"http://backend:8080\"\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("`server.backend_hmac_secret`") && err.contains("16 bytes"), "{err}");
    Jail::expect_with(|jail| {
        jail.set_env("TOOLGRAPH_SERVER_STORE", "backend");
        jail.set_env("TOOLGRAPH_SERVER_BACKEND_URL", "http://backend:8080");
        jail.set_env("TOOLGRAPH_SERVER_BACKEND_HMAC_SECRET", "0123456789abcdef");
        let c = Config::load(None).unwrap();
        assert_eq!(c.server.store, StoreKind::Backend);
        assert_eq!(c.server.backend_url.as_deref(), Some("http://backend:8080"));
        assert_eq!(c.server.backend_hmac_secret.as_ref().map(|s| s.expose()), Some("0123456789abcdef"));
        assert!(!c.to_masked_toml().contains("0123456789abcdef"), "the secret is masked");
        Ok(())
    });
    // Without the backend store, its settings are not required.
    assert!(Config::from_toml_str("[server]\nstore = \"memory\"\n").is_ok());
}

#[test]
fn a_missing_config_file_is_an_error() {
    let err = Config::load(Some(Path::new("/nonexistent/toolgraph.toml"))).unwrap_err().to_string();
    assert!(err.contains("/nonexistent/toolgraph.toml") && err.contains("does not exist"), "{err}");
}

#[test]
fn agents_are_declared_in_tables() {
    let c = Config::from_toml_str(
        "default_agent = \"tutor\"\n[agents.tutor]\nsystem_prompt = \"Eres un tutor.\"\ntools = [\"calculator\"]\nstate_keys = [\"asignatura\"]\nhistory_budget = 2000\n",
    )
    .unwrap();
    let t = &c.agents["tutor"];
    assert_eq!(t.tools.as_deref(), Some(&["calculator".to_string()][..]));
    assert_eq!(t.history_budget, 2000);
    assert_eq!(t.max_tool_retries, 3, "defaults fill the rest");
    assert_eq!(c.default_agent_name(), "tutor");
    let err = Config::from_toml_str("default_agent = \"nope\"\n").unwrap_err().to_string();
    assert!(err.contains("no agent named 'nope'"), "{err}");
    let err = Config::from_toml_str("[agents.a]\nsytem_prompt = \"x\"\n").unwrap_err().to_string();
    assert!(err.contains("sytem_prompt"), "{err}");
    assert_eq!(Config::default().default_agent_name(), "assistant");
}

#[test]
fn auth_modes_need_their_credentials() {
    let err = Config::from_toml_str("[server]\nauth = \"hmac\"\n").unwrap_err().to_string();
    assert!(err.contains("server.hmac_secret"), "{err}");
    let err = Config::from_toml_str("[server]\nauth = \"api_key\"\n").unwrap_err().to_string();
    assert!(err.contains("server.api_keys"), "{err}");
    let err = Config::from_toml_str("[server]\nauth = \"api_key\"\n[server.api_keys]\ndemo = \"plaintext-key\"\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("server.api_keys.demo") && err.contains("SHA-256"), "{err}");
    let bound = format!("[server]\nauth = \"api_key\"\n[server.api_keys]\ndemo = \"{}\"\n", "ab".repeat(32));
    let c = Config::from_toml_str(&format!("{bound}[server.api_key_tenants]\ndemo = 7\n")).unwrap();
    assert_eq!(c.server.api_key_tenants["demo"], 7);
    let err = Config::from_toml_str(&format!("{bound}[server.api_key_tenants]\nacme = 7\n")).unwrap_err().to_string();
    assert!(err.contains("server.api_key_tenants.acme") && err.contains("no key"), "{err}");
    let err = Config::from_toml_str(&format!("{bound}[server.api_key_tenants]\ndemo = 0\n")).unwrap_err().to_string();
    assert!(err.contains("server.api_key_tenants.demo") && err.contains("positive"), "{err}");
    // A key bound to no tenant id could act on any: refused unless the operator opts in.
    let err = Config::from_toml_str(&bound).unwrap_err().to_string();
    assert!(err.contains("server.api_key_tenants") && err.contains("allow_unbound_api_keys"), "{err}");
    let two = format!("{bound}acme = \"{}\"\n[server.api_key_tenants]\ndemo = 7\n", "cd".repeat(32));
    let err = Config::from_toml_str(&two).unwrap_err().to_string();
    assert!(err.contains("acme") && !err.contains("demo,"), "only the unbound key is named: {err}");
    let ok = format!(
        "[server]\nauth = \"api_key\"\nallow_unbound_api_keys = true\n[server.api_keys]\ndemo = \"{}\"\n",
        "ab".repeat(32)
    );
    assert_eq!(Config::from_toml_str(&ok).unwrap().server.auth, AuthKind::ApiKey);
}

#[test]
fn provider_names_are_kebab_case() {
    let c = Config::from_toml_str("[llm]\nprovider = \"llama-cpp\"\n").unwrap();
    assert_eq!(c.llm.provider, Some(Provider::LlamaCpp));
    // As the docs spell it; the older spelling still loads.
    for spelling in ["openai", "open-ai"] {
        let c = Config::from_toml_str(&format!("[llm]\nprovider = \"{spelling}\"\n")).unwrap();
        assert_eq!(c.llm.provider, Some(Provider::OpenAi), "{spelling}");
    }
    assert_eq!(serde_json::to_value(Provider::OpenAi).unwrap(), "openai");
    assert!(Config::from_toml_str("[llm]\nprovider = \"anthropic\"\n").is_err());
}

#[test]
fn the_legal_and_crisis_tools_and_agent_graphs_are_configured_and_checked() {
    let c =
        Config::from_toml_str("[tools.legal]\n[tools.crisis]\n[agents.luat]\ngraph = \"legal_pipeline\"\n").unwrap();
    assert_eq!(c.tools.legal.as_ref().map(|l| l.kb.as_str()), Some("luat"), "the table alone turns them on");
    assert_eq!(c.tools.legal.as_ref().map(|l| l.answer_articles), Some(2));
    let crisis = c.tools.crisis.clone().unwrap();
    assert_eq!((crisis.search_provider, crisis.search_timeout_ms), (crate::SearchProvider::None, 15_000));
    assert_eq!(c.agents["luat"].graph, crate::AgentGraph::LegalPipeline);
    assert_eq!(AgentSettings::default().graph, crate::AgentGraph::React);
    let text = "[tools.crisis]\nsearch_provider = \"gemini\"\nsearch_api_key = \"AIza-secret\"\n";
    let c = Config::from_toml_str(text).unwrap();
    let crisis = c.tools.crisis.unwrap();
    assert_eq!(crisis.search_provider, crate::SearchProvider::Gemini);
    assert!(!format!("{crisis:?}").contains("AIza-secret"), "the key never prints");
    for (text, key) in [
        ("[agents.a]\ngraph = \"plan_and_execute\"\n", "graph"),
        ("[tools.crisis]\nsearch_provider = \"bing\"\n", "search_provider"),
        ("[tools.crisis]\nsearch_base_url = \"api:80\"\n", "`tools.crisis.search_base_url`"),
        ("[tools.crisis]\nsearch_timeout_ms = 0\n", "`tools.crisis.search_timeout_ms`"),
        ("[tools.legal]\nkb = \"\"\n", "`tools.legal.kb`"),
        ("[tools.legal]\nurl = \"laws/{law}\"\n", "`tools.legal.url`"),
        ("[tools.legal]\nanswer_articles = 0\n", "`tools.legal.answer_articles`"),
        ("[tools.legal]\nanswer_articles = 21\n", "`tools.legal.answer_articles`"),
    ] {
        let err = Config::from_toml_str(text).unwrap_err().to_string();
        assert!(err.contains(key), "{text}: {err}");
    }
    let c = Config::from_toml_str("[tools.legal]\nurl = \"https://laws.example/s?q={law}&a={article}\"\n").unwrap();
    assert!(c.tools.legal.unwrap().url.is_some());
}

#[test]
fn variables_read_by_the_binary_are_not_configuration_keys() {
    // Each would otherwise stop every command with "unknown field".
    Jail::expect_with(|jail| {
        jail.create_file("toolgraph.toml", "")?;
        for (name, value) in [
            ("TOOLGRAPH_THREADS", "2"),
            ("TOOLGRAPH_KERNELS", "avx2"),
            ("TOOLGRAPH_ALLOCATOR", "mimalloc"),
            ("TOOLGRAPH_LOG", "info"),
            ("TOOLGRAPH_MODELS_DIR", "/tmp/models"),
            ("TOOLGRAPH_API_KEY", "tg_demo_key"),
            ("TOOLGRAPH_DEMO_PORT", "8081"),
            ("TOOLGRAPH_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test"),
            ("TOOLGRAPH_QDRANT_BIN", "/tmp/qdrant"),
            ("TOOLGRAPH_PG_BINDIR", "/usr/lib/postgresql/15/bin"),
            ("TOOLGRAPH_MCP_PYTHON", "/tmp/venv/bin/python"),
            ("TOOLGRAPH_MCP_EVERYTHING", "/tmp/everything.js"),
            ("TOOLGRAPH_BENCH_PG", "postgres://postgres@127.0.0.1:5432/test"),
        ] {
            jail.set_env(name, value);
        }
        Config::load(Some(Path::new("toolgraph.toml"))).map_err(|e| e.to_string())?;
        Ok(())
    });
}

#[test]
fn a_table_inside_a_section_is_reached_with_single_or_double_underscores() {
    for variable in ["TOOLGRAPH_TOOLS_COURSE_BACKEND_URL", "TOOLGRAPH_TOOLS_COURSE__BACKEND_URL"] {
        Jail::expect_with(|jail| {
            jail.create_file("toolgraph.toml", "")?;
            jail.set_env(variable, "http://backend:9000");
            let c = Config::load(Some(Path::new("toolgraph.toml"))).map_err(|e| e.to_string())?;
            assert_eq!(
                c.tools.course.and_then(|t| t.backend_url).as_deref(),
                Some("http://backend:9000"),
                "{variable}"
            );
            Ok(())
        });
    }
    // A key of the section whose name starts like a table is left whole.
    Jail::expect_with(|jail| {
        jail.create_file("toolgraph.toml", "")?;
        jail.set_env("TOOLGRAPH_TOOLS_SQL_DATABASE", "sqlite::memory:");
        let c = Config::load(Some(Path::new("toolgraph.toml"))).map_err(|e| e.to_string())?;
        assert_eq!(c.tools.sql_database.as_deref(), Some("sqlite::memory:"));
        Ok(())
    });
}

#[test]
fn a_relative_graph_file_is_read_beside_the_configuration_that_names_it() {
    figment::Jail::expect_with(|jail| {
        std::fs::create_dir("conf").map_err(|e| e.to_string())?;
        jail.create_file(
            "conf/toolgraph.toml",
            "[agents.desk]\ngraph_file = \"desk.toml\"\n[agents.abs]\ngraph_file = \"/srv/abs.toml\"\n",
        )?;
        let c = Config::load(Some(Path::new("conf/toolgraph.toml"))).map_err(|e| e.to_string())?;
        assert_eq!(c.agents["desk"].graph_file.as_deref(), Some(Path::new("conf/desk.toml")));
        assert_eq!(c.agents["abs"].graph_file.as_deref(), Some(Path::new("/srv/abs.toml")));
        let err = Config::from_toml_str("[agents.x]\ngraph = \"legal_pipeline\"\ngraph_file = \"g.toml\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("agents.x.graph_file") && err.contains("not both"), "{err}");
        Ok(())
    });
}
