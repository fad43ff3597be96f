//! The prompt side of the local chat model with the real GGUF file's metadata (fetched by
//! `scripts/fetch-models chat-0.5b`): its tokenizer round-trips multilingual text and keeps the
//! chat markers as single tokens, and its own template offers tools in the Qwen format.

mod common;

use serde_json::json;
use toolgraph_llm::{Message, ToolDefinition};
use toolgraph_local_models::chat::{GgufChatAssets, QWEN_0_5B_FILE};
use toolgraph_local_models::models_dir;

fn assets() -> Option<GgufChatAssets> {
    let loaded = GgufChatAssets::from_file(&models_dir().join(QWEN_0_5B_FILE));
    common::weights_or_skip("the chat model file", loaded).map(|(a, _)| a)
}

#[test]
fn the_gguf_tokenizer_round_trips_and_keeps_markers_whole() {
    let Some(a) = assets() else { return };
    for text in ["¿Cuándo es el examen final?", "Người nghiện ma túy", "기말 시험은 언제입니까?", "fn main() {}\n"]
    {
        let ids = a.tokenizer.encode(text, false).unwrap().get_ids().to_vec();
        assert!(!ids.is_empty());
        assert_eq!(a.tokenizer.decode(&ids, false).unwrap(), text);
    }
    let ids = a.tokenizer.encode("<|im_start|>user\nhola<|im_end|>", false).unwrap().get_ids().to_vec();
    let im_end = a.tokenizer.token_to_id("<|im_end|>").unwrap();
    assert_eq!(ids.first(), a.tokenizer.token_to_id("<|im_start|>").as_ref());
    assert_eq!(ids.last(), Some(&im_end));
    assert!(a.stop_tokens.contains(&im_end));
    // A reply that opens the next message has ended.
    assert!(a.stop_tokens.contains(&ids[0]), "<|im_start|> stops a reply");
    assert!(a.context_length >= 4096, "{}", a.context_length);
}

#[test]
fn the_files_own_template_offers_tools_in_its_format() {
    let Some(a) = assets() else { return };
    let tools = [ToolDefinition {
        name: "rag_search".into(),
        description: "Search the course documents".into(),
        parameters: json!({"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}),
    }];
    let prompt = a.template.render(&[Message::system("Eres un tutor."), Message::user("¿Examen?")], &tools).unwrap();
    let offered = prompt.contains("\"name\": \"rag_search\"") || prompt.contains("\"name\":\"rag_search\"");
    assert!(prompt.contains("<tools>") && offered, "{prompt}");
    assert!(prompt.contains("<tool_call>"), "the template tells the model how to call: {prompt}");
    assert!(prompt.trim_end().ends_with("<|im_start|>assistant"), "{prompt}");
}
