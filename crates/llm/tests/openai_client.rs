//! The OpenAI-compatible client against the scripted server, over real loopback HTTP.

use futures::StreamExt;
use scripted_llm::{Reply, ScriptedModelServer, Step};
use serde_json::json;
use std::time::{Duration, Instant};
use toolgraph_llm::{
    ChatEvent, ChatModel, ChatRequest, FinishReason, LlmError, Message, OpenAiChatModel, OpenAiConfig, ResponseFormat,
    RetryPolicy, ToolCall, ToolChoice, ToolDefinition, collect_response,
};

fn client(server: &ScriptedModelServer) -> OpenAiChatModel {
    let mut cfg = OpenAiConfig::new(server.base_url(), "scripted");
    cfg.retry =
        RetryPolicy { max_retries: 2, base_delay: Duration::from_millis(10), max_delay: Duration::from_secs(2) };
    cfg.first_byte_timeout = Duration::from_millis(800);
    cfg.idle_timeout = Duration::from_millis(300);
    OpenAiChatModel::new(cfg).unwrap()
}

fn request() -> ChatRequest {
    ChatRequest::new(vec![Message::system("You are terse."), Message::user("¿Qué es Docker?")])
}

#[tokio::test]
async fn streams_interleaved_text_and_two_parallel_tool_calls() {
    let server = ScriptedModelServer::start(vec![Reply::Stream(vec![
        Step::Text("Let me ".into()),
        Step::ToolCallStart { index: 0, id: "call_a".into(), name: "rag_search".into() },
        Step::Text("check. ".into()),
        Step::ToolCallStart { index: 1, id: "call_b".into(), name: "calculator".into() },
        Step::ToolArgs { index: 0, fragment: "{\"query\":".into() },
        Step::ToolArgs { index: 1, fragment: "{\"expression\":\"6*7\"}".into() },
        Step::ToolArgs { index: 0, fragment: "\"docker\"}".into() },
        Step::Finish("tool_calls".into()),
        Step::Usage { prompt: 31, completion: 17 },
        Step::Done,
    ])])
    .await
    .unwrap();
    let mut stream = client(&server).stream(request()).await.unwrap();
    let mut events = Vec::new();
    while let Some(e) = stream.next().await {
        events.push(e.unwrap());
    }
    let text: String =
        events.iter().filter_map(|e| if let ChatEvent::TextDelta(t) = e { Some(t.as_str()) } else { None }).collect();
    assert_eq!(text, "Let me check. ");
    let deltas = events.iter().filter(|e| matches!(e, ChatEvent::ToolCallDelta { .. })).count();
    assert_eq!(deltas, 5, "every fragment is surfaced live");
    let calls: Vec<&ToolCall> =
        events.iter().filter_map(|e| if let ChatEvent::ToolCall(c) = e { Some(c) } else { None }).collect();
    assert_eq!(
        calls,
        vec![
            &ToolCall { id: "call_a".into(), name: "rag_search".into(), arguments: "{\"query\":\"docker\"}".into() },
            &ToolCall { id: "call_b".into(), name: "calculator".into(), arguments: "{\"expression\":\"6*7\"}".into() },
        ]
    );
    assert!(events.contains(&ChatEvent::Usage(toolgraph_llm::Usage {
        prompt_tokens: 31,
        completion_tokens: 17,
        cached_prompt_tokens: 0
    })));
    assert_eq!(events.last(), Some(&ChatEvent::Finished(FinishReason::ToolCalls)));
    // The request asked for usage in the stream.
    assert_eq!(server.requests()[0]["stream_options"], json!({"include_usage": true}));
}

#[tokio::test]
async fn rate_limit_with_retry_after_is_honoured_then_succeeds() {
    let server = ScriptedModelServer::start(vec![Reply::rate_limited("1"), Reply::text("hola")]).await.unwrap();
    let started = Instant::now();
    let resp = collect_response(client(&server).stream(request()).await.unwrap()).await.unwrap();
    assert_eq!(resp.content, "hola");
    assert_eq!(server.request_count(), 2);
    assert!(started.elapsed() >= Duration::from_millis(950), "waited {:?}, Retry-After said 1 s", started.elapsed());
}

#[tokio::test]
async fn server_errors_are_retried_a_bounded_number_of_times() {
    let server = ScriptedModelServer::start(vec![
        Reply::status(500, "upstream exploded"),
        Reply::status(502, "bad gateway"),
        Reply::status(503, "still down"),
        Reply::text("never reached"),
    ])
    .await
    .unwrap();
    let err = collect_response(client(&server).stream(request()).await.unwrap()).await.unwrap_err();
    assert_eq!(server.request_count(), 3, "one attempt plus max_retries=2");
    let msg = err.to_string();
    assert!(matches!(err, LlmError::RetriesExhausted { attempts: 3, .. }), "{err:?}");
    assert_eq!(err.status(), Some(503));
    assert!(msg.contains(&format!("{}/chat/completions", server.base_url())), "{msg}");
    assert!(msg.contains("HTTP 503") && msg.contains("still down"), "{msg}");
}

#[tokio::test]
async fn client_errors_are_not_retried() {
    let server = ScriptedModelServer::start(vec![Reply::status(400, "bad schema"), Reply::text("x")]).await.unwrap();
    let err = collect_response(client(&server).stream(request()).await.unwrap()).await.unwrap_err();
    assert_eq!(server.request_count(), 1);
    assert_eq!(err.status(), Some(400));
}

#[tokio::test]
async fn a_stall_mid_reply_hits_the_idle_timeout_and_is_not_retried() {
    let server = ScriptedModelServer::start(vec![
        Reply::Stream(vec![
            Step::Text("Docker is ".into()),
            Step::Pause(Duration::from_secs(5)),
            Step::Text("late".into()),
        ]),
        Reply::text("a second copy the caller must never see"),
    ])
    .await
    .unwrap();
    let mut stream = client(&server).stream(request()).await.unwrap();
    assert_eq!(stream.next().await.unwrap().unwrap(), ChatEvent::TextDelta("Docker is ".into()));
    let started = Instant::now();
    let err = stream.next().await.unwrap().unwrap_err();
    assert!(matches!(err, LlmError::IdleTimeout { .. }), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(err.to_string().contains("went silent"), "{err}");
    assert!(stream.next().await.is_none(), "nothing after an error");
    assert_eq!(server.request_count(), 1, "no retry once tokens were streamed");
}

#[tokio::test]
async fn a_stall_before_the_first_byte_is_retried() {
    let server = ScriptedModelServer::start(vec![
        Reply::Stream(vec![Step::Pause(Duration::from_secs(5)), Step::Text("too late".into())]),
        Reply::text("fresh answer"),
    ])
    .await
    .unwrap();
    let resp = collect_response(client(&server).stream(request()).await.unwrap()).await.unwrap();
    assert_eq!(resp.content, "fresh answer");
    assert_eq!(server.request_count(), 2);
}

#[tokio::test]
async fn a_malformed_chunk_is_a_clear_error() {
    let server = ScriptedModelServer::start(vec![Reply::Stream(vec![
        Step::Text("ok ".into()),
        Step::Raw("{\"choices\": [ this is not json".into()),
        Step::Done,
    ])])
    .await
    .unwrap();
    let err = collect_response(client(&server).stream(request()).await.unwrap()).await.unwrap_err();
    assert!(matches!(err, LlmError::Malformed { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("malformed chunk") && msg.contains("this is not json"), "{msg}");
    assert_eq!(server.request_count(), 1);
}

#[tokio::test]
async fn a_stream_cut_before_finishing_is_an_error_not_a_short_answer() {
    let server = ScriptedModelServer::start(vec![Reply::Stream(vec![Step::Text("half an ".into())])]).await.unwrap();
    let err = collect_response(client(&server).stream(request()).await.unwrap()).await.unwrap_err();
    assert!(err.to_string().contains("without a finish reason"), "{err}");
}

#[tokio::test]
async fn an_unreachable_endpoint_is_retried_then_named() {
    // Bind then drop a listener: the port is closed, so connecting is refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut cfg = OpenAiConfig::new(format!("http://127.0.0.1:{port}/v1"), "m");
    cfg.retry =
        RetryPolicy { max_retries: 1, base_delay: Duration::from_millis(5), max_delay: Duration::from_millis(10) };
    let err = collect_response(OpenAiChatModel::new(cfg).unwrap().stream(request()).await.unwrap()).await.unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, LlmError::RetriesExhausted { attempts: 2, .. }), "{err:?}");
    assert!(
        msg.contains(&format!("cannot connect to model endpoint http://127.0.0.1:{port}/v1/chat/completions")),
        "{msg}"
    );
}

#[tokio::test]
async fn a_provider_error_inside_the_stream_is_reported() {
    let server = ScriptedModelServer::start(vec![Reply::Stream(vec![Step::Raw(
        r#"{"error":{"message":"context length exceeded"}}"#.into(),
    )])])
    .await
    .unwrap();
    let err = collect_response(client(&server).stream(request()).await.unwrap()).await.unwrap_err();
    assert!(err.to_string().contains("context length exceeded"), "{err}");
}

#[tokio::test]
async fn non_streaming_completion_with_tools_choice_and_structured_output() {
    let server = ScriptedModelServer::start(vec![
        Reply::tool_calls(&[("c1", "calculator", json!({"expression": "2+2"}))]),
        Reply::text("{\"answer\": 4}"),
    ])
    .await
    .unwrap();
    let model = client(&server);
    let tools = vec![ToolDefinition {
        name: "calculator".into(),
        description: "math".into(),
        parameters: json!({"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "Args", "type": "object",
            "properties": {"expression": {"type": "string"}}, "required": ["expression"]}),
    }];
    let mut req = request().with_tools(tools);
    req.tool_choice = Some(ToolChoice::Tool("calculator".into()));
    let resp = model.complete(req).await.unwrap();
    assert_eq!(resp.finish_reason, FinishReason::ToolCalls);
    assert_eq!(resp.tool_calls[0].name, "calculator");
    assert_eq!(resp.tool_calls[0].arguments, r#"{"expression":"2+2"}"#);
    let sent = &server.requests()[0];
    assert_eq!(sent["stream"], json!(false));
    assert_eq!(sent["tool_choice"], json!({"type": "function", "function": {"name": "calculator"}}));
    assert!(sent["tools"][0]["function"]["parameters"].get("$schema").is_none(), "normalised before sending");

    let mut req = request();
    req.response_format = Some(ResponseFormat::JsonSchema {
        name: "answer".into(),
        schema: json!({"type": "object", "properties": {"answer": {"type": "integer", "format": "uint8"}}}),
        strict: true,
    });
    let resp = model.complete(req).await.unwrap();
    assert_eq!(resp.content, "{\"answer\": 4}");
    let sent = &server.requests()[1]["response_format"];
    assert_eq!(sent["type"], "json_schema");
    assert_eq!(sent["json_schema"]["name"], "answer");
    assert!(sent["json_schema"]["schema"]["properties"]["answer"].get("format").is_none());
}

#[tokio::test]
async fn a_narrowed_tool_choice_sends_only_the_allowed_tools() {
    let server = ScriptedModelServer::start(vec![Reply::text("a"), Reply::text("b")]).await.unwrap();
    let model = client(&server);
    let tool = |name: &str| ToolDefinition {
        name: name.into(),
        description: name.into(),
        parameters: json!({"type": "object", "properties": {}}),
    };
    let mut req = request().with_tools(vec![tool("search"), tool("cite")]);
    req.tool_choice = Some(ToolChoice::Allowed(vec!["search".into()]));
    model.complete(req.clone()).await.unwrap();
    let sent = &server.requests()[0];
    let names: Vec<&str> =
        sent["tools"].as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["search"]);
    assert!(sent.get("tool_choice").is_none(), "the narrowed list is the choice: {sent}");

    // Nothing allowed: no tools at all (an empty list is refused by OpenAI).
    req.tool_choice = Some(ToolChoice::Allowed(Vec::new()));
    model.complete(req).await.unwrap();
    let sent = &server.requests()[1];
    assert!(sent.get("tools").is_none() && sent.get("tool_choice").is_none(), "{sent}");
}

#[tokio::test]
async fn tool_history_is_sent_in_the_openai_shape() {
    let server = ScriptedModelServer::start(vec![Reply::text("done")]).await.unwrap();
    let req = ChatRequest::new(vec![
        Message::user("2+2?"),
        Message::Assistant {
            content: String::new(),
            tool_calls: vec![ToolCall {
                id: "c1".into(),
                name: "calculator".into(),
                arguments: "{\"expression\":\"2+2\"}".into(),
            }],
        },
        Message::tool("c1", "calculator", "{\"result\":4}"),
    ]);
    collect_response(client(&server).stream(req).await.unwrap()).await.unwrap();
    let msgs = &server.requests()[0]["messages"];
    assert_eq!(msgs[1]["content"], serde_json::Value::Null);
    assert_eq!(msgs[1]["tool_calls"][0]["function"]["name"], "calculator");
    assert_eq!(
        msgs[2],
        json!({"role": "tool", "tool_call_id": "c1", "name": "calculator", "content": "{\"result\":4}"})
    );
}

#[test]
fn a_base_url_that_is_not_http_is_refused() {
    let err = OpenAiChatModel::new(OpenAiConfig::new("ftp://example", "m")).unwrap_err();
    assert!(err.to_string().contains("must be http or https"), "{err}");
    let err = OpenAiChatModel::new(OpenAiConfig::new("not a url", "m")).unwrap_err();
    assert!(err.to_string().contains("is not a URL"), "{err}");
}

#[tokio::test]
async fn gemini_style_tool_calls_without_index_in_one_chunk() {
    // Gemini's OpenAI endpoint sends each call whole, without `index`, several in one delta.
    let chunk = json!({"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [
        {"id": "g1", "type": "function", "function": {"name": "get_guia", "arguments": "{\"key\":\"competencias\"}"}},
        {"id": "g2", "type": "function", "function": {"name": "calculator", "arguments": "{\"expression\":\"2*21\"}"}}
    ]}, "finish_reason": "tool_calls"}]});
    let server =
        ScriptedModelServer::start(vec![Reply::Stream(vec![Step::Raw(chunk.to_string()), Step::Done])]).await.unwrap();
    let resp = collect_response(client(&server).stream(request()).await.unwrap()).await.unwrap();
    let calls: Vec<(&str, &str, &str)> =
        resp.tool_calls.iter().map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str())).collect();
    assert_eq!(
        calls,
        [("g1", "get_guia", "{\"key\":\"competencias\"}"), ("g2", "calculator", "{\"expression\":\"2*21\"}")]
    );
}

#[tokio::test]
async fn ollama_style_complete_calls_with_a_stop_finish_are_tool_calls() {
    // Ollama sends complete calls with an index but finishes with "stop".
    let chunk = json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "", "tool_calls": [
        {"index": 0, "id": "call_x", "type": "function", "function": {"name": "note_list", "arguments": "{}"}}
    ]}, "finish_reason": "stop"}]});
    let server =
        ScriptedModelServer::start(vec![Reply::Stream(vec![Step::Raw(chunk.to_string()), Step::Done])]).await.unwrap();
    let resp = collect_response(client(&server).stream(request()).await.unwrap()).await.unwrap();
    assert_eq!(resp.finish_reason, FinishReason::ToolCalls, "callers route on this");
    assert_eq!(resp.tool_calls[0].name, "note_list");
}

#[tokio::test]
async fn gemini_base_urls_get_gemini_schemas_on_the_wire() {
    // A Gemini-style provider setting changes what is sent: no null types, `nullable` instead.
    let server = ScriptedModelServer::start(vec![Reply::text("ok")]).await.unwrap();
    let mut cfg = OpenAiConfig::new(server.base_url(), "gemini-2.5-flash");
    cfg.provider = toolgraph_llm::Provider::Gemini;
    let tools = vec![ToolDefinition {
        name: "rag_search".into(),
        description: "search".into(),
        parameters: json!({"type": "object", "properties": {"top_k": {"type": ["integer", "null"], "format": "uint8"}}}),
    }];
    collect_response(OpenAiChatModel::new(cfg).unwrap().stream(request().with_tools(tools)).await.unwrap())
        .await
        .unwrap();
    let sent = &server.requests()[0]["tools"][0]["function"]["parameters"]["properties"]["top_k"];
    assert_eq!(sent, &json!({"type": "integer", "nullable": true}));
}
