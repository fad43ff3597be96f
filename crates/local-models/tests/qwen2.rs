//! The Qwen2 decoder with the real 0.5B weights (`scripts/fetch-models chat-0.5b`): greedy
//! generation answers a factual question, Q5_0 tensors are re-quantised, a second prompt that
//! shares the first one's prefix computes only its new tokens with identical results, and the
//! KV cache's slots keep alternating prompts apart.

mod common;

use std::time::Instant;
use toolgraph_llm::Message;
use toolgraph_local_models::chat::qwen2::{Qwen2, argmax};
use toolgraph_local_models::chat::{GgufChatAssets, QWEN_0_5B_FILE};
use toolgraph_local_models::models_dir;

#[test]
fn greedy_generation_answers_and_the_prefix_cache_is_exact() {
    let path = models_dir().join(QWEN_0_5B_FILE);
    let Some((assets, content)) = common::weights_or_skip("the chat model file", GgufChatAssets::from_file(&path))
    else {
        return;
    };
    let mut file = std::fs::File::open(&path).unwrap();
    let t = Instant::now();
    let mut model = Qwen2::load(&content, &mut file, 4096).unwrap();
    eprintln!("load {:.1} s, {} tensors re-quantised", t.elapsed().as_secs_f64(), model.requantised);
    assert!(model.requantised >= 100, "the 0.5B model's Q5_0 tensors go to Q8_0");

    let prompt = |q: &str| {
        let text =
            assets.template.render(&[Message::system("You are a concise assistant."), Message::user(q)], &[]).unwrap();
        assets.tokenizer.encode(text.as_str(), false).unwrap().get_ids().to_vec()
    };
    let generate = |model: &mut Qwen2, mut ids: Vec<u32>, max: usize| -> (String, usize, f64) {
        let (mut computed, start, mut out) = (0, Instant::now(), Vec::new());
        for _ in 0..max {
            let (logits, n) = model.next_logits(&ids).unwrap();
            computed += n;
            let next = argmax(&logits);
            if assets.stop_tokens.contains(&next) {
                break;
            }
            out.push(next);
            ids.push(next);
        }
        (assets.tokenizer.decode(&out, true).unwrap(), computed, start.elapsed().as_secs_f64())
    };

    let first = prompt("What is the capital of France? Answer with one word.");
    let (answer, computed, secs) = generate(&mut model, first.clone(), 12);
    eprintln!("answer {answer:?}: {computed} tokens computed in {secs:.1} s");
    assert!(answer.contains("Paris"), "{answer:?}");

    // Same system prompt, another question: only the tokens after the shared prefix are computed.
    let second = prompt("What is the capital of Spain? Answer with one word.");
    let shared = first.iter().zip(&second).take_while(|(a, b)| a == b).count();
    let t = Instant::now();
    let (logits, computed) = model.next_logits(&second).unwrap();
    eprintln!("second prompt: {computed} of {} tokens computed in {:.2} s", second.len(), t.elapsed().as_secs_f64());
    assert_eq!(computed, second.len() - shared);
    model.clear_cache();
    let (fresh, all) = model.next_logits(&second).unwrap();
    assert_eq!(all, second.len());
    // Every token's arithmetic is the same whether it is computed alone, in a group or after a
    // cached prefix, so the two agree to the bit.
    assert_eq!(argmax(&logits), argmax(&fresh), "cached and fresh prefill agree");
    assert!(logits == fresh, "cached and fresh prefill give different logits");
    let (answer, _, _) = generate(&mut model, second.clone(), 12);
    assert!(answer.contains("Madrid"), "{answer:?}");

    // A prefix kept on disk and loaded into a cleared cache is the state that was computed:
    // the rest of the prompt then gives exactly the logits it gives after the computed prefix.
    let dir = tempfile::tempdir().unwrap();
    let kept = dir.path().join("prefix.safetensors");
    let head = second.len() - 3;
    model.clear_cache();
    model.next_logits(&second[..head]).unwrap();
    model.save_prefix(&kept, head).unwrap();
    let (computed_logits, _) = model.next_logits(&second).unwrap();
    model.clear_cache();
    assert_eq!(model.load_prefix(&kept).unwrap(), head);
    let (loaded_logits, computed) = model.next_logits(&second).unwrap();
    assert_eq!(computed, 3, "only the tokens after the kept prefix are computed");
    assert_eq!(computed_logits, loaded_logits, "the kept state is the computed one, bit for bit");
    // A file that is no prefix is refused, the cache left as it was.
    std::fs::write(&kept, b"not a prefix").unwrap();
    assert!(model.load_prefix(&kept).is_err());
    assert_eq!(model.cached_len(), second.len());

    // A probe computes another prompt's logits and leaves the cache as it was.
    let (before, _) = model.next_logits(&second).unwrap();
    let probed = model.probe_logits(&first).unwrap();
    assert_eq!(model.cached_len(), second.len());
    let (after, computed) = model.next_logits(&second).unwrap();
    assert_eq!(computed, 1, "the cached prompt is still there");
    assert!(before == after, "the probe changed the cached state");
    model.clear_cache();
    let (fresh_first, _) = model.next_logits(&first).unwrap();
    assert!(probed == fresh_first, "the probe's logits are the prompt's own");

    // With two cache slots, prompts that alternate keep their own state: a conversation,
    // another prompt (a tool asking the same model, with its own system prompt), then the
    // conversation going on computes only its new tokens, with the logits of a fresh run.
    let other = {
        let text = assets
            .template
            .render(&[Message::system("Translate into Spanish."), Message::user("Good morning")], &[])
            .unwrap();
        assets.tokenizer.encode(text.as_str(), false).unwrap().get_ids().to_vec()
    };
    let common = |a: &[u32], b: &[u32]| a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let longer: Vec<u32> = second.iter().chain(&first[shared..]).copied().collect();
    let alternate = |model: &mut Qwen2| -> (usize, Vec<f32>) {
        model.clear_cache();
        assert_eq!(model.next_logits(&second).unwrap().1, second.len());
        let (_, computed) = model.next_logits(&other).unwrap();
        assert_eq!(computed, other.len() - common(&other, &second), "the shared template start is reused");
        let (logits, computed) = model.next_logits(&longer).unwrap();
        (computed, logits)
    };
    model.set_cache_slots(2);
    let (computed, kept_logits) = alternate(&mut model);
    assert_eq!(computed, longer.len() - second.len(), "the conversation's slot survived the other prompt");
    model.set_cache_slots(1);
    let (computed, one_slot_logits) = alternate(&mut model);
    assert_eq!(computed, longer.len() - common(&longer, &other), "one slot: the other prompt replaced it");
    assert!(kept_logits == one_slot_logits, "a slot's kept state is the computed one, bit for bit");

    // A prompt that leaves a slot's tokens part way (the same system prompt, another
    // question) is computed in another slot from a copy of the shared part, and the first
    // slot still holds its whole prompt.
    model.set_cache_slots(2);
    model.clear_cache();
    model.next_logits(&second).unwrap();
    assert_eq!(model.next_logits(&first).unwrap().1, first.len() - shared, "the shared prefix was copied");
    assert_eq!(model.next_logits(&longer).unwrap().1, longer.len() - second.len(), "the first slot is intact");
    let (again, computed) = model.next_logits(&first).unwrap();
    assert_eq!(computed, 1, "so is the second");
    assert!(again == fresh_first, "a copied prefix gives the logits of a fresh run");

    // A draft's rows are, bit for bit, the logits each longer prompt gives computed alone.
    let draft = &first[first.len() - 5..];
    model.clear_cache();
    let (rows, computed) = model.draft_logits(&second, draft).unwrap();
    assert_eq!(computed, second.len(), "the draft is not counted as prompt");
    let vocab = model.vocab();
    assert_eq!(rows.len(), (draft.len() + 1) * vocab);
    // A prompt that takes two drafted tokens and parts from the third goes on in the same
    // slot: only its last token is computed, and no copy of the prefix is made.
    let parted: Vec<u32> = second.iter().chain(&draft[..2]).chain(&[draft[2] + 1]).copied().collect();
    let (parted_logits, computed) = model.next_logits(&parted).unwrap();
    assert_eq!(computed, 1, "the taken drafted tokens are reused");
    assert_eq!(model.cached_sequences().count(), 1, "a draft the prompt left is no other sequence");
    for i in 0..=draft.len() {
        let longer: Vec<u32> = second.iter().chain(&draft[..i]).copied().collect();
        model.clear_cache();
        let (alone, _) = model.next_logits(&longer).unwrap();
        assert!(rows[i * vocab..(i + 1) * vocab] == alone[..], "row {i} differs from the prompt computed alone");
    }
    model.clear_cache();
    assert!(model.next_logits(&parted).unwrap().0 == parted_logits, "after a draft, the logits of a fresh run");

    // A reply that ends after taking two drafted tokens leaves the cache holding its own
    // tokens, none of the draft it did not take.
    let taken: Vec<u32> = second.iter().chain(&draft[..2]).copied().collect();
    model.clear_cache();
    model.draft_logits(&second, draft).unwrap();
    model.settle_draft(&taken);
    assert_eq!(model.cached_sequences().collect::<Vec<_>>(), [&taken[..]]);
    assert_eq!(model.next_logits(&taken).unwrap().1, 1, "the taken tokens stay computed");
}

mod chat_model {
    use futures::StreamExt;
    use serde_json::json;
    use toolgraph_llm::{
        ChatEvent, ChatModel, ChatRequest, ChatStream, FinishReason, Message, ToolCall, ToolChoice, ToolDefinition,
    };
    use toolgraph_local_models::chat::{LocalChatModel, LocalChatOptions, QWEN_0_5B_FILE};
    use toolgraph_local_models::models_dir;

    fn request(user: &str, tools: Vec<ToolDefinition>) -> ChatRequest {
        ChatRequest {
            messages: vec![Message::system("You are a helpful assistant."), Message::user(user)],
            tools,
            tool_choice: None,
            response_format: None,
            temperature: None,
            max_tokens: Some(64),
            stop: Vec::new(),
        }
    }

    /// The 0.5B's weights, or `None` (a SKIP printed) when they are missing outside CI.
    fn weights() -> Option<std::path::PathBuf> {
        let path = models_dir().join(QWEN_0_5B_FILE);
        if !path.exists() && std::env::var_os("CI").is_none() {
            eprintln!("SKIP: {} missing (scripts/fetch-models chat-0.5b)", path.display());
            return None;
        }
        Some(path)
    }

    /// The model at `path`, loaded off the runtime's threads.
    async fn loaded(path: std::path::PathBuf, options: LocalChatOptions) -> LocalChatModel {
        tokio::task::spawn_blocking(move || LocalChatModel::load(&path, options)).await.unwrap().unwrap()
    }

    /// A streamed reply's text, tool calls and finish reason.
    async fn reply_of(mut s: ChatStream) -> (String, Vec<ToolCall>, Option<FinishReason>) {
        let (mut text, mut calls, mut finish) = (String::new(), Vec::new(), None);
        while let Some(e) = s.next().await {
            match e.unwrap() {
                ChatEvent::TextDelta(t) => text.push_str(&t),
                ChatEvent::ToolCall(c) => calls.push(c),
                ChatEvent::Finished(f) => finish = Some(f),
                _ => {}
            }
        }
        (text, calls, finish)
    }

    /// A streamed reply's token counts.
    async fn usage_of(mut s: ChatStream) -> toolgraph_llm::Usage {
        let mut usage = None;
        while let Some(e) = s.next().await {
            if let ChatEvent::Usage(u) = e.unwrap() {
                usage = Some(u);
            }
        }
        usage.expect("the local model reports its usage")
    }

    fn calculator() -> ToolDefinition {
        ToolDefinition {
            name: "calculator".into(),
            description: "Evaluate an arithmetic expression exactly.".into(),
            parameters: json!({"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn streams_prose_calls_tools_without_leaking_them_and_queues_with_a_bound() {
        let Some(path) = weights() else { return };
        let model = loaded(path, LocalChatOptions { queue: 1, ..LocalChatOptions::default() }).await;

        // A tool call: it arrives as a ToolCall event and no text carries any of it.
        let s =
            model.stream(request("What is 1234 * 5678? Use the calculator tool.", vec![calculator()])).await.unwrap();
        let (text, calls, finish) = reply_of(s).await;
        assert_eq!(calls.len(), 1, "text {text:?}");
        assert_eq!(calls[0].name, "calculator");
        let args: serde_json::Value = serde_json::from_str(&calls[0].arguments).unwrap();
        assert!(args["expression"].as_str().unwrap().contains("1234"), "{args}");
        assert!(!text.contains("tool_call") && !text.contains("\"name\""), "leaked: {text:?}");
        assert_eq!(finish, Some(FinishReason::ToolCalls));

        // The call and its result in the next prompt: the call reads as the model wrote it, so
        // the tokens computed while writing it are reused, not computed again.
        let mut asked = request("What is 1234 * 5678? Use the calculator tool.", vec![calculator()]);
        let first = usage_of(model.stream(asked.clone()).await.unwrap()).await;
        asked.messages.push(Message::Assistant { content: String::new(), tool_calls: calls.clone() });
        asked.messages.push(Message::Tool {
            tool_call_id: calls[0].id.clone(),
            name: "calculator".into(),
            content: r#"{"result": 7006652}"#.into(),
        });
        let next = usage_of(model.stream(asked).await.unwrap()).await;
        assert!(
            next.cached_prompt_tokens >= first.prompt_tokens + first.completion_tokens - 1,
            "the call's tokens were computed again: {first:?} then {next:?}"
        );

        // Prose streams as several deltas and finishes with Stop.
        let mut s = model.stream(request("Say hello in Spanish, in one short sentence.", Vec::new())).await.unwrap();
        let (mut deltas, mut reply, mut finish) = (0, String::new(), None);
        while let Some(e) = s.next().await {
            match e.unwrap() {
                ChatEvent::TextDelta(t) => {
                    deltas += 1;
                    reply.push_str(&t);
                }
                ChatEvent::Finished(f) => finish = Some(f),
                _ => {}
            }
        }
        assert!(deltas > 1 && reply.to_lowercase().contains("hola"), "{deltas} deltas: {reply:?}");
        assert_eq!(finish, Some(FinishReason::Stop));

        // A reply told to call a tool is exactly one call to it, even where the model would
        // answer in prose, and no text carries it.
        let weather = ToolDefinition {
            name: "weather".into(),
            description: "The weather in a city.".into(),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
        };
        let mut told = request("Say hello in Spanish, in one short sentence.", vec![calculator(), weather]);
        told.tool_choice = Some(ToolChoice::Tool("weather".into()));
        let (text, calls, finish) = reply_of(model.stream(told).await.unwrap()).await;
        assert_eq!(calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["weather"], "text {text:?}");
        assert!(text.trim().is_empty(), "leaked: {text:?}");
        assert_eq!(finish, Some(FinishReason::ToolCalls));

        // A stop sequence several tokens long ends the reply, and none of it is streamed, not
        // even the pieces that arrived before it was complete.
        let mut counting =
            request("Count from 1 to 10, separated by a comma and a space. Only the numbers.", Vec::new());
        counting.stop = vec![", 5".into()];
        let mut s = model.stream(counting).await.unwrap();
        let (mut reply, mut finish) = (String::new(), None);
        while let Some(e) = s.next().await {
            match e.unwrap() {
                ChatEvent::TextDelta(t) => reply.push_str(&t),
                ChatEvent::Finished(f) => finish = Some(f),
                _ => {}
            }
        }
        assert!(reply.trim_end().ends_with('4') && !reply.contains('5'), "{reply:?}");
        assert_eq!(finish, Some(FinishReason::Stop));

        // One running + one waiting: the third is refused with 429 and Retry-After.
        let long = || request("Write a long story about a cat.", Vec::new());
        let first = model.stream(long()).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let second = model.stream(long()).await.unwrap();
        let third = model.stream(long()).await;
        let err = third.err().expect("a full queue refuses");
        assert_eq!(err.status(), Some(429), "{err}");
        drop((first, second));
    }

    /// `prepare` keeps its prompt's state in `prefix_dir`, a file per prompt and no more files
    /// than cache slots; an ordinary request keeps nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_warm_up_keeps_its_prompt_on_disk() {
        let Some(path) = weights() else { return };
        let dir = tempfile::tempdir().unwrap();
        let options =
            LocalChatOptions { prefix_dir: Some(dir.path().to_owned()), cache_slots: 2, ..LocalChatOptions::default() };
        let model = loaded(path, options).await;
        let drain = |r: ChatRequest| {
            let model = &model;
            async move {
                let mut s = model.stream(r).await.unwrap();
                while let Some(e) = s.next().await {
                    e.unwrap();
                }
            }
        };
        let kept =
            || std::fs::read_dir(dir.path()).unwrap().filter_map(Result::ok).map(|e| e.file_name()).collect::<Vec<_>>();
        drain(request("Hello", vec![calculator()])).await;
        assert!(kept().is_empty(), "an answer is not a prepared prompt: {:?}", kept());
        model.prepare(request(".", vec![calculator()])).await.unwrap();
        let files = kept();
        assert_eq!(files.len(), 1, "{files:?}");
        assert!(files[0].to_string_lossy().starts_with("qwen2.5-coder-0.5b"), "named by the weights: {files:?}");
        // The same prompt again: the same file. Other prompts: a file each, the oldest removed
        // past the two slots.
        model.prepare(request(".", vec![calculator()])).await.unwrap();
        assert_eq!(kept(), files);
        let with_system = |system: &str| {
            let mut r = request(".", vec![calculator()]);
            r.messages[0] = Message::system(system);
            r
        };
        model.prepare(with_system("You answer questions about law.")).await.unwrap();
        assert_eq!(kept().len(), 2, "{:?}", kept());
        std::thread::sleep(std::time::Duration::from_millis(20));
        model.prepare(with_system("You are a course tutor.")).await.unwrap();
        let now = kept();
        assert_eq!(now.len(), 2, "{now:?}");
        assert!(!now.contains(&files[0]), "the oldest prompt's file was removed: {now:?}");
    }

    /// Drafts read from the prompt change how soon a reply is written, not what it says: a
    /// reply that quotes its prompt, greedy and sampled, and a tool call are the same with
    /// drafts and without, and with drafts the replies took drafted tokens.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn drafts_from_the_prompt_write_the_same_replies() {
        use toolgraph_local_models::chat::draft::PromptLookup;
        let Some(path) = weights() else { return };
        let load =
            |lookup: PromptLookup| loaded(path.clone(), LocalChatOptions { lookup, ..LocalChatOptions::default() });
        let (with, without) = (load(PromptLookup::default()).await, load(PromptLookup::OFF).await);
        let quote = "Copy this sentence exactly, then say which month the exam is in: \
                     «El examen final supone el 60 % de la nota y se celebra en la convocatoria ordinaria de enero; \
                     para aprobar hace falta al menos un 4 sobre 10 en él.»";
        let mut asked = Vec::new();
        for temperature in [None, Some(0.8)] {
            let mut r = request(quote, Vec::new());
            (r.temperature, r.max_tokens) = (temperature, Some(80));
            asked.push(r);
        }
        asked.push(request("What is 1234 * 5678? Use the calculator tool.", vec![calculator()]));
        let mut taken_by_call = 0;
        for r in asked {
            let before = with.draft_counts().1;
            let drafted = reply_of(with.stream(r.clone()).await.unwrap()).await;
            let plain = reply_of(without.stream(r.clone()).await.unwrap()).await;
            assert_eq!(drafted, plain, "temperature {:?}", r.temperature);
            assert!(!drafted.0.is_empty() || !drafted.1.is_empty());
            if !r.tools.is_empty() {
                assert_eq!(drafted.1.len(), 1, "one calculator call: {drafted:?}");
                taken_by_call = with.draft_counts().1 - before;
            }
        }
        let (drafted, taken) = with.draft_counts();
        assert!(taken >= 20 && taken <= drafted, "{taken} of {drafted} drafted tokens taken");
        // The call's head (`<tool_call>\n{"name": "`: five tokens after the first) and, drafted
        // from the call guide, the rest of the name and `", "arguments": {"expression": "`, then
        // the call's end.
        assert!(taken_by_call >= 12, "{taken_by_call} drafted tokens taken by the call");
        assert_eq!(without.draft_counts(), (0, 0));
    }

    /// What the grounded agents judge a question by (`ChatModel::tail_logprobs`): a question is
    /// far likelier after the passage that answers it than after one on the same subject that
    /// does not, a tail that is not the message's end is refused, one too long is not scored,
    /// and scoring leaves the cache as it was — the reply after it is the same, and reads the
    /// scored prompt as computed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_question_is_likelier_after_the_passage_that_answers_it() {
        let Some(path) = weights() else { return };
        let model = loaded(path, LocalChatOptions::default()).await;
        let question = "How many tonnes of honey did the cooperative of Valdeolmos sell in 2019?";
        let answers = "The cooperative of Valdeolmos was founded in 1962 by eleven beekeepers. In 2019 it \
            sold 412 tonnes of honey, most of it to bakeries in Madrid, and opened a shop in Alcalá.";
        let same_subject = "The cooperative of Valdeolmos keeps its hives in the hills north of the town. \
            Its beekeepers move them twice a year, to the rosemary in spring and to the heather in autumn.";
        let asking = |content: String| request(&content, Vec::new());
        let mean = |lp: &[f32]| lp.iter().sum::<f32>() / lp.len() as f32;
        let alone = model.tail_logprobs(asking(format!("Question: {question}")), question).await.unwrap().unwrap();
        assert!(alone.len() >= 10 && alone.iter().all(|p| p.is_finite() && *p <= 0.0), "{alone:?}");
        let after = |passage: &str| {
            let asked = asking(format!("Documents:\n[Valdeolmos] {passage}\n\nQuestion: {question}"));
            let model = &model;
            async move { model.tail_logprobs(asked, question).await.unwrap().unwrap() }
        };
        let (answered, unrelated) = (after(answers).await, after(same_subject).await);
        assert_eq!((answered.len(), unrelated.len()), (alone.len(), alone.len()), "the same tokens scored");
        let gain = |lp: &[f32]| mean(lp) - mean(&alone);
        eprintln!("gain after the answer {:.2}, after the same subject {:.2}", gain(&answered), gain(&unrelated));
        assert!(gain(&answered) > gain(&unrelated) + 0.5, "{} vs {}", gain(&answered), gain(&unrelated));

        // Not the message's end: refused, not scored.
        let refused = model.tail_logprobs(asking(format!("Question: {question} Thanks.")), question).await;
        assert!(matches!(refused, Err(toolgraph_llm::LlmError::InvalidRequest(_))), "{refused:?}");
        // Too long a tail to score: the model cannot tell.
        let long = "and then the next question ".repeat(30);
        assert_eq!(model.tail_logprobs(asking(format!("Question: {long}")), &long).await.unwrap(), None);

        // Scoring leaves what a reply reads as it was: the same reply as a fresh model's, with the
        // scored prompt's prefix (the passage and all before it) read from the cache.
        let full = asking(format!("Documents:\n[Valdeolmos] {answers}\n\nQuestion: {question}"));
        let after_scoring = model.tail_logprobs(full.clone(), question).await.unwrap().unwrap();
        assert!(after_scoring == answered, "scoring the same prompt twice gives the same figures");
        let usage = usage_of(model.stream(full.clone()).await.unwrap()).await;
        let (reply, _, _) = reply_of(model.stream(full.clone()).await.unwrap()).await;
        let fresh = loaded(models_dir().join(QWEN_0_5B_FILE), LocalChatOptions::default()).await;
        let (fresh_reply, _, _) = reply_of(fresh.stream(full).await.unwrap()).await;
        assert_eq!(reply, fresh_reply);
        assert!(
            usage.cached_prompt_tokens + 40 >= usage.prompt_tokens,
            "the reply computed its prompt again after scoring: {usage:?}"
        );
    }
}
