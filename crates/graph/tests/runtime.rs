//! The graph runtime against every checkpoint store: the same suite, three times.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use toolgraph_graph::*;
use toolgraph_testkit::Backend;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct Chat {
    log: Vec<String>,
    decided: Vec<String>,
    loops: u32,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct ChatUpdate {
    #[serde(default)]
    log: Vec<String>,
    #[serde(default)]
    decided: Vec<String>,
    #[serde(default)]
    loops: Option<u32>,
}

impl State for Chat {
    type Update = ChatUpdate;
    fn apply(&mut self, u: ChatUpdate) {
        self.log.extend(u.log);
        self.decided.extend(u.decided);
        if let Some(l) = u.loops {
            self.loops = l;
        }
    }
}

fn say(text: &str) -> ChatUpdate {
    ChatUpdate { log: vec![text.to_owned()], ..Default::default() }
}

/// Test dependencies: counters that reveal repeated side effects.
#[derive(Default)]
struct Deps {
    side_effects: AtomicUsize,
    executed: std::sync::Mutex<Vec<String>>,
    /// How often `apply` began (its second run takes its time when the plan asked it "slowly").
    applies: AtomicUsize,
}

type Ctx = RunContext<Deps>;

/// user → echo → END
fn echo_graph(store: Arc<dyn Checkpointer>) -> CompiledGraph<Chat, Deps> {
    let mut g = StateGraph::<Chat, Deps>::new();
    g.add_node("echo", |s: Arc<Chat>, _c: Ctx| async move {
        let last = s.log.last().cloned().unwrap_or_default();
        Ok(NodeOutput::Update(say(&format!("echo: {last}"))))
    });
    g.add_edge(START, "echo").add_edge("echo", END);
    g.compile(Deps::default(), store).unwrap()
}

/// plan (side effect, then pause on two actions) → apply (resume point) → END
fn approval_graph(store: Arc<dyn Checkpointer>) -> CompiledGraph<Chat, Deps> {
    let mut g = StateGraph::<Chat, Deps>::new();
    g.add_node("plan", |_s: Arc<Chat>, c: Ctx| async move {
        c.deps().side_effects.fetch_add(1, Ordering::SeqCst);
        Ok(NodeOutput::Interrupt {
            update: say("planned"),
            requests: vec![
                InterruptRequest { key: "send_sms".into(), payload: serde_json::json!({"to": "+34600000000"}) },
                InterruptRequest { key: "create_announcement".into(), payload: serde_json::json!({"title": "Exam"}) },
            ],
            resume_at: "apply".into(),
        })
    });
    g.add_node("apply", |s: Arc<Chat>, c: Ctx| async move {
        if s.log.iter().any(|l| l.contains("slowly")) && c.deps().applies.fetch_add(1, Ordering::SeqCst) == 1 {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        let mut decided = Vec::new();
        for (key, d) in c.decisions() {
            if *d == Decision::Approve {
                c.deps().executed.lock().unwrap().push(key.clone());
            }
            decided.push(format!("{key}={d:?}"));
        }
        Ok(NodeOutput::Update(ChatUpdate { decided, ..Default::default() }))
    });
    g.add_edge(START, "plan").add_edge("plan", END).add_edge("apply", END).add_resume("plan", "apply");
    g.compile(Deps::default(), store).unwrap()
}

/// user → work → END; `work` hangs on a message starting with "slow" (a process that dies
/// there never finishes it) and echoes anything else. Recovery closes a cut turn with a note.
fn hanging_graph(store: Arc<dyn Checkpointer>) -> CompiledGraph<Chat, Deps> {
    let mut g = StateGraph::<Chat, Deps>::new();
    g.add_node("work", |s: Arc<Chat>, _c: Ctx| async move {
        let last = s.log.last().cloned().unwrap_or_default();
        if last.starts_with("slow") {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        Ok(NodeOutput::Update(say(&format!("done: {last}"))))
    });
    g.add_edge(START, "work").add_edge("work", END);
    g.set_recovery(|s: &Chat, _| Some(say(&format!("cut short after {} entries", s.log.len()))));
    g.compile(Deps::default(), store).unwrap()
}

fn thread(n: u32) -> ThreadId {
    ThreadId::new("tenant7", n)
}

async fn a_run_that_died_mid_way_is_closed_and_the_thread_goes_on(b: &Backend) {
    let t = thread(21);
    let dying = hanging_graph(b.open().await);
    let mut run = dying.start(&t, say("slow question"), RunOptions::default()).await.unwrap();
    // The run is inside its node when "the process dies": it never writes again.
    while !matches!(run.next_event().await, Some(RunEvent::NodeStarted { .. })) {}
    // A new process: a fresh graph over the same store.
    let g = hanging_graph(b.open().await);
    let refused = g.start(&t, say("next"), RunOptions::default()).await.err();
    assert!(matches!(refused, Some(GraphError::ConcurrentRun { .. })), "a run looks alive to a caller without a claim");
    // The thread's owner (the service, holding its lease) knows the run is dead.
    assert!(g.close_interrupted(&t).await.unwrap(), "a dead run is closed");
    assert!(!g.close_interrupted(&t).await.unwrap(), "an idle thread is left alone");
    let (_, out) = g.start(&t, say("next"), opts_owned()).await.unwrap().collect().await;
    let RunOutcome::Completed { state } = out else { panic!("{out:?}") };
    assert_eq!(state.log, ["slow question", "cut short after 1 entries", "next", "done: next"]);
    let history = g.history(&t).await.unwrap();
    assert_eq!(
        history.iter().map(|c| c.kind).collect::<Vec<_>>(),
        [RecordKind::Input, RecordKind::Stop, RecordKind::Input, RecordKind::Step]
    );
    // An owner starting a turn over a dead run closes it itself, the same way.
    let dying = hanging_graph(b.open().await);
    let mut run = dying.start(&t, say("slow again"), opts_owned()).await.unwrap();
    while !matches!(run.next_event().await, Some(RunEvent::NodeStarted { .. })) {}
    let g = hanging_graph(b.open().await);
    let (_, out) = g.start(&t, say("and now"), opts_owned()).await.unwrap().collect().await;
    let RunOutcome::Completed { state } = out else { panic!("{out:?}") };
    assert_eq!(&state.log[4..], ["slow again", "cut short after 5 entries", "and now", "done: and now"]);
}

fn opts_owned() -> RunOptions {
    RunOptions { owns_thread: true, ..RunOptions::default() }
}

async fn multi_turn_persists_and_resumes_in_a_new_process(b: &Backend) {
    {
        let g = echo_graph(b.open().await);
        let (_, out) = g.start(&thread(1), say("hola"), RunOptions::default()).await.unwrap().collect().await;
        assert!(matches!(out, RunOutcome::Completed { .. }), "{out:?}");
    }
    // A new graph over a newly opened store: what a restarted process sees.
    let g = echo_graph(b.open().await);
    let (events, out) = g.start(&thread(1), say("¿qué tal?"), RunOptions::default()).await.unwrap().collect().await;
    let RunOutcome::Completed { state } = out else { panic!("{out:?}") };
    assert_eq!(state.log, ["hola", "echo: hola", "¿qué tal?", "echo: ¿qué tal?"]);
    assert!(matches!(events.first(), Some(RunEvent::RunStarted { .. })));
    // It starts from the second run's input, the thread's third checkpoint (after the first
    // run's input and step).
    assert!(events.contains(&RunEvent::NodeStarted { node: "echo".into(), step: 1, from: 3 }), "{events:?}");
    assert_eq!(events.last(), Some(&RunEvent::Completed));
    let head = g.thread_state(&thread(1)).await.unwrap().unwrap();
    assert_eq!(head.state, state);
    assert_eq!(head.version, 4, "input + step per turn");
    assert!(head.next.is_none());
}

async fn two_interrupts_resume_each_to_its_own_call_and_nothing_repeats(b: &Backend) {
    let g = approval_graph(b.open().await);
    let out = g.start(&thread(2), say("do both"), RunOptions::default()).await.unwrap().outcome().await;
    let RunOutcome::Interrupted { pending, state } = out else { panic!("{out:?}") };
    assert_eq!(state.log, ["do both", "planned"]);
    assert_eq!(pending.len(), 2);
    assert_ne!(pending[0].id, pending[1].id);
    let sms = pending.iter().find(|p| p.key == "send_sms").unwrap().id.clone();
    let ann = pending.iter().find(|p| p.key == "create_announcement").unwrap().id.clone();

    // A new turn cannot start while decisions are pending.
    assert!(matches!(
        g.start(&thread(2), say("ignore that"), RunOptions::default()).await,
        Err(GraphError::AwaitingDecision { pending: 2, .. })
    ));

    // Decide one: the run waits for the other.
    let g2 = approval_graph(b.open().await); // as another replica would
    let r =
        g2.resume(&thread(2), BTreeMap::from([(ann.clone(), Decision::Reject)]), RunOptions::default()).await.unwrap();
    let ResumeResult::Waiting { undecided } = r else { panic!("should wait") };
    assert_eq!(undecided.iter().map(|p| &p.id).collect::<Vec<_>>(), vec![&sms]);
    // Same decision again: a no-op; the opposite: refused.
    assert!(matches!(
        g2.resume(&thread(2), BTreeMap::from([(ann.clone(), Decision::Reject)]), RunOptions::default()).await.unwrap(),
        ResumeResult::Waiting { .. }
    ));
    assert!(matches!(
        g2.resume(&thread(2), BTreeMap::from([(ann.clone(), Decision::Approve)]), RunOptions::default()).await,
        Err(GraphError::ConflictingDecision(_))
    ));
    assert!(matches!(
        g2.resume(&thread(2), BTreeMap::from([(InterruptId("nope".into()), Decision::Approve)]), RunOptions::default())
            .await,
        Err(GraphError::UnknownInterrupt(_))
    ));

    // The last decision resumes the run after the pause point.
    let r = g2.resume(&thread(2), BTreeMap::from([(sms, Decision::Approve)]), RunOptions::default()).await.unwrap();
    let ResumeResult::Started(run) = r else { panic!("should start") };
    let RunOutcome::Completed { state } = run.outcome().await else { panic!("completed") };
    assert_eq!(state.decided, ["create_announcement=Reject", "send_sms=Approve"]);
    assert_eq!(*g2.deps().executed.lock().unwrap(), ["send_sms"], "the rejected action never ran");
    assert_eq!(g.deps().side_effects.load(Ordering::SeqCst), 1, "the pre-pause side effect ran once");
    assert_eq!(g2.deps().side_effects.load(Ordering::SeqCst), 0, "resume did not re-run the pausing node");
    // Nothing is left to resume; the thread accepts a new turn.
    assert!(matches!(
        g2.resume(&thread(2), BTreeMap::new(), RunOptions::default()).await,
        Err(GraphError::NothingToResume(_))
    ));
}

async fn recursion_limit_ends_the_run_with_a_defined_outcome(b: &Backend) {
    let mut g = StateGraph::<Chat, Deps>::new();
    g.add_node("spin", |s: Arc<Chat>, _c: Ctx| async move {
        Ok(NodeOutput::Update(ChatUpdate { loops: Some(s.loops + 1), ..Default::default() }))
    });
    g.add_edge(START, "spin").add_conditional_edges("spin", |_s: &Chat| "spin".to_string(), ["spin", END]);
    let g = g.compile(Deps::default(), b.open().await).unwrap();
    let opts = RunOptions { recursion_limit: 4, ..RunOptions::default() };
    let (events, out) = g.start(&thread(3), say("go"), opts).await.unwrap().collect().await;
    let RunOutcome::RecursionLimit { state, limit } = out else { panic!("{out:?}") };
    assert_eq!((state.loops, limit), (4, 4));
    assert_eq!(events.last(), Some(&RunEvent::RecursionLimit { limit: 4 }));
    // The thread is idle again: a next turn starts (and hits the limit again).
    let again =
        g.start(&thread(3), say("again"), RunOptions { recursion_limit: 2, ..RunOptions::default() }).await.unwrap();
    assert!(matches!(again.outcome().await, RunOutcome::RecursionLimit { limit: 2, .. }));
}

async fn a_panicking_node_fails_the_run_not_the_process(b: &Backend) {
    let mut g = StateGraph::<Chat, Deps>::new();
    g.add_node("fragile", |s: Arc<Chat>, _c: Ctx| async move {
        if s.log.last().is_some_and(|l| l == "boom") {
            panic!("index out of bounds: the len is 0");
        }
        Ok(NodeOutput::Update(say("fine")))
    });
    g.add_edge(START, "fragile").add_edge("fragile", END);
    let g = g.compile(Deps::default(), b.open().await).unwrap();
    let (events, out) = g.start(&thread(4), say("boom"), RunOptions::default()).await.unwrap().collect().await;
    let RunOutcome::Failed { error, .. } = out else { panic!("{out:?}") };
    assert!(error.to_string().contains("index out of bounds"), "{error}");
    assert!(matches!(events.last(), Some(RunEvent::Error { .. })));
    let out = g.start(&thread(4), say("calm"), RunOptions::default()).await.unwrap().outcome().await;
    assert_eq!(out.state().log.last().unwrap(), "fine", "the thread keeps working");
}

async fn concurrent_runs_on_one_thread_never_interleave(b: &Backend) {
    // Two graphs over two store handles: two replicas sharing one database.
    let slow = |label: &'static str| {
        move |_s: Arc<Chat>, _c: Ctx| async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok(NodeOutput::Update(say(label)))
        }
    };
    let mut g = StateGraph::<Chat, Deps>::new();
    g.add_node("slow", slow("reply from replica 1"));
    g.add_edge(START, "slow").add_edge("slow", END);
    let g1 = g.compile(Deps::default(), b.open().await).unwrap();
    let mut g = StateGraph::<Chat, Deps>::new();
    g.add_node("slow", slow("reply from replica 2"));
    g.add_edge(START, "slow").add_edge("slow", END);
    let g2 = g.compile(Deps::default(), b.open().await).unwrap();

    let t = thread(5);
    let (a, bb) = tokio::join!(
        g1.start(&t, say("first"), RunOptions::default()),
        g2.start(&t, say("second"), RunOptions::default())
    );
    let (winner, loser) = match (a, bb) {
        (Ok(w), Err(e)) | (Err(e), Ok(w)) => (w, e),
        (Ok(_), Ok(_)) => panic!("both runs started on one thread"),
        (Err(e1), Err(e2)) => panic!("both refused: {e1} / {e2}"),
    };
    assert!(matches!(loser, GraphError::ConcurrentRun { .. }), "{loser}");
    // While the winner runs, a third start is refused too.
    assert!(matches!(
        g2.start(&thread(5), say("third"), RunOptions::default()).await,
        Err(GraphError::ConcurrentRun { .. })
    ));
    let out = winner.outcome().await;
    assert!(matches!(out, RunOutcome::Completed { .. }));
    let log = g1.thread_state(&thread(5)).await.unwrap().unwrap().state.log.clone();
    assert_eq!(log.len(), 2, "one coherent turn: {log:?}");
}

async fn fork_from_an_earlier_checkpoint(b: &Backend) {
    let g = echo_graph(b.open().await);
    for text in ["uno", "dos"] {
        g.start(&thread(6), say(text), RunOptions::default()).await.unwrap().outcome().await;
    }
    let history = g.history(&thread(6)).await.unwrap();
    assert_eq!(history.len(), 4);
    assert_eq!(history[1].node.as_deref(), Some("echo"));
    let at = history[1].seq; // after the first turn
    assert_eq!(g.state_at(&thread(6), at).await.unwrap().state.log, ["uno", "echo: uno"]);
    let fork = ThreadId::new("tenant7", "6-fork");
    g.fork(&thread(6), at, &fork).await.unwrap();
    let out = g.start(&fork, say("tres"), RunOptions::default()).await.unwrap().outcome().await;
    assert_eq!(out.state().log, ["uno", "echo: uno", "tres", "echo: tres"]);
    let original = g.thread_state(&thread(6)).await.unwrap().unwrap().state.log.clone();
    assert_eq!(original, ["uno", "echo: uno", "dos", "echo: dos"], "the original is untouched");
    assert!(matches!(
        g.fork(&thread(6), at, &fork).await,
        Err(GraphError::Checkpoint(CheckpointError::ThreadExists(_)))
    ));
    assert!(matches!(g.state_at(&thread(6), 99).await, Err(GraphError::NotFound { .. })));
}

async fn a_state_update_is_a_step_of_the_node_it_names_and_the_next_turn_reads_it(b: &Backend) {
    let g = echo_graph(b.open().await);
    let t = thread(60);
    g.start(&t, say("uno"), RunOptions::default()).await.unwrap().outcome().await;
    let seq = g
        .update_state(&t, Some("echo"), |s| {
            assert_eq!(s.log, ["uno", "echo: uno"], "the update is made from the head's state");
            Ok(say("echo: corrected"))
        })
        .await
        .unwrap();
    assert_eq!(seq, 3);
    let last = g.history(&t).await.unwrap().pop().unwrap();
    assert_eq!((last.seq, last.kind, last.node.as_deref()), (3, RecordKind::Step, Some("echo")));
    let head = g.thread_state(&t).await.unwrap().unwrap();
    assert_eq!(head.state.log, ["uno", "echo: uno", "echo: corrected"]);
    assert!(head.next.is_none(), "the thread stays idle");
    // Another process reads the same.
    let other = echo_graph(b.open().await);
    assert_eq!(other.thread_state(&t).await.unwrap().unwrap().state.log, head.state.log);
    let out = g.start(&t, say("dos"), RunOptions::default()).await.unwrap().outcome().await;
    assert_eq!(&out.state().log[3..], ["dos", "echo: dos"]);

    // Refusals write nothing.
    assert!(
        matches!(g.update_state(&t, Some("nope"), |_| Ok(say("x"))).await, Err(GraphError::UnknownNode(n)) if n == "nope")
    );
    let refused = g.update_state(&t, None, |_| Err("no such channel".to_owned())).await;
    assert!(matches!(refused, Err(GraphError::InvalidUpdate(m)) if m == "no such channel"));
    assert_eq!(g.history(&t).await.unwrap().len(), 5);

    let paused = approval_graph(b.open().await);
    let p = thread(61);
    paused.start(&p, say("do both"), RunOptions::default()).await.unwrap().outcome().await;
    let refused = paused.update_state(&p, None, |_| Ok(say("sneaked in"))).await;
    assert!(matches!(refused, Err(GraphError::AwaitingDecision { pending: 2, .. })), "{refused:?}");
    assert!(!paused.thread_state(&p).await.unwrap().unwrap().state.log.contains(&"sneaked in".to_owned()));

    let hanging = hanging_graph(b.open().await);
    let h = thread(62);
    let mut run = hanging.start(&h, say("slow"), RunOptions::default()).await.unwrap();
    loop {
        match run.next_event().await {
            Some(RunEvent::NodeStarted { .. }) => break,
            Some(_) => {}
            None => panic!("the run ended before its node started"),
        }
    }
    let refused = hanging.update_state(&h, None, |_| Ok(say("mid-run"))).await;
    assert!(matches!(refused, Err(GraphError::ConcurrentRun { .. })), "{refused:?}");
}

/// Each seq of `t` and the state it reads.
async fn states(g: &CompiledGraph<Chat, Deps>, t: &ThreadId) -> Vec<(u64, RecordKind, Chat)> {
    let mut out = Vec::new();
    for meta in g.history(t).await.unwrap() {
        out.push((meta.seq, meta.kind, g.state_at(t, meta.seq).await.unwrap().state.as_ref().clone()));
    }
    out
}

async fn a_finished_thread_is_compacted_to_its_last_checkpoints_which_read_the_same(b: &Backend) {
    let store = b.open().await;
    let g = echo_graph(store.clone());
    let t = thread(40);
    for text in ["uno", "dos", "tres"] {
        g.start(&t, say(text), RunOptions::default()).await.unwrap().outcome().await;
    }
    let before = states(&g, &t).await;
    assert_eq!(before.len(), 6);
    assert_eq!(store.compact_thread(&t, 0).await.unwrap(), 0, "keep 0: everything is kept");
    assert_eq!(store.compact_thread(&t, 3).await.unwrap(), 0, "not more than twice as many as kept");
    assert_eq!(store.compact_thread(&t, 2).await.unwrap(), 4);
    let after = states(&g, &t).await;
    assert_eq!(after, before[4..], "the last two, each reading what it read before");
    assert!(matches!(g.state_at(&t, 4).await, Err(GraphError::NotFound { .. })), "an older one is gone");
    assert_eq!(store.compact_thread(&t, 2).await.unwrap(), 0, "nothing more to fold");
    // The thread goes on from its head, here and in a fresh process, and forks from a kept seq.
    g.start(&t, say("cuatro"), RunOptions::default()).await.unwrap().outcome().await;
    let fresh = echo_graph(b.open().await);
    let state = fresh.thread_state(&t).await.unwrap().unwrap().state.log.clone();
    assert_eq!(state, ["uno", "echo: uno", "dos", "echo: dos", "tres", "echo: tres", "cuatro", "echo: cuatro"]);
    let fork = ThreadId::new("tenant7", "40-fork");
    g.fork(&t, after[0].0, &fork).await.unwrap();
    assert_eq!(g.thread_state(&fork).await.unwrap().unwrap().state.as_ref(), &after[0].2);
    // Keeping one folds everything into the head.
    let head = fresh.thread_state(&t).await.unwrap().unwrap().state.as_ref().clone();
    assert_eq!(store.compact_thread(&t, 2).await.unwrap(), 0, "four records: not more than twice two");
    assert_eq!(store.compact_thread(&t, 1).await.unwrap(), 3);
    assert_eq!(states(&fresh, &t).await.iter().map(|(_, _, s)| s.clone()).collect::<Vec<_>>(), [head]);
}

async fn a_paused_thread_is_not_compacted_nor_a_decision_kept_first(b: &Backend) {
    let store = b.open().await;
    let g = approval_graph(store.clone());
    let t = thread(41);
    let out = g.start(&t, say("do both"), RunOptions::default()).await.unwrap().outcome().await;
    let RunOutcome::Interrupted { pending, .. } = out else { panic!("{out:?}") };
    assert_eq!(store.compact_thread(&t, 1).await.unwrap(), 0, "it waits for decisions");
    for p in &pending {
        let decided = BTreeMap::from([(p.id.clone(), Decision::Approve)]);
        if let ResumeResult::Started(run) = g.resume(&t, decided, RunOptions::default()).await.unwrap() {
            run.outcome().await;
        }
    }
    let before = states(&g, &t).await;
    let kinds: Vec<RecordKind> = before.iter().map(|(_, k, _)| *k).collect();
    // Keep from the second decision: the fold starts one earlier, at the first, and that is a
    // decision too: at the interrupt it answers.
    let second_decision = kinds.iter().rposition(|k| *k == RecordKind::Decision).unwrap();
    let keep = (kinds.len() - second_decision) as u64;
    assert!(kinds[second_decision - 1] == RecordKind::Decision, "{kinds:?}");
    assert!(kinds.len() as u64 > 2 * keep, "{kinds:?}");
    let deleted = store.compact_thread(&t, keep).await.unwrap();
    let after = states(&g, &t).await;
    assert!(deleted > 0, "{kinds:?}");
    assert_eq!(after[0].1, RecordKind::Interrupt, "back past both decisions: {after:?}");
    assert_eq!(after.len() as u64 + deleted, before.len() as u64);
    assert_eq!(after, before[before.len() - after.len()..]);
    assert_eq!(g.thread_state(&t).await.unwrap().unwrap().state.decided.len(), 2);
}

async fn a_truncated_thread_reads_as_before_its_last_run_here_and_in_a_cached_graph(b: &Backend) {
    let store = b.open().await;
    let g = echo_graph(store.clone());
    let t = thread(42);
    for text in ["uno", "dos"] {
        g.start(&t, say(text), RunOptions::default()).await.unwrap().outcome().await;
    }
    // `g` caches the head at seq 4; the second run's two records go.
    assert_eq!(store.truncate_thread(&t, 2).await.unwrap(), 2);
    assert_eq!(g.thread_state(&t).await.unwrap().unwrap().state.log, ["uno", "echo: uno"]);
    g.start(&t, say("tres"), RunOptions::default()).await.unwrap().outcome().await;
    let log = echo_graph(b.open().await).thread_state(&t).await.unwrap().unwrap().state.log.clone();
    assert_eq!(log, ["uno", "echo: uno", "tres", "echo: tres"]);
    assert_eq!(store.truncate_thread(&t, 9).await.unwrap(), 0, "nothing after 9");
    assert_eq!(store.truncate_thread(&t, 0).await.unwrap(), 4);
    assert!(g.thread_state(&t).await.unwrap().is_none(), "every record gone");
}

async fn storage_grows_linearly(b: &Backend) {
    let store = b.open().await;
    let g = echo_graph(store.clone());
    let reply = "token ".repeat(40);
    let mut sizes = Vec::new();
    for turns in [50u32, 100] {
        while g.thread_state(&thread(8)).await.unwrap().map_or(0, |t| t.version) < u64::from(turns) * 2 {
            g.start(&thread(8), say(&reply), RunOptions::default()).await.unwrap().outcome().await;
        }
        sizes.push(store.stored_bytes().await.unwrap() as f64);
    }
    let ratio = sizes[1] / sizes[0];
    assert!(ratio < 2.4, "bytes(100 turns) / bytes(50 turns) = {ratio:.2}; O(N) storage means ≈ 2, O(N²) ≈ 4");
}

async fn the_last_complete_checkpoint_is_readable_mid_step(b: &Backend) {
    let mut g = StateGraph::<Chat, Deps>::new();
    g.add_node("first", |_s: Arc<Chat>, _c: Ctx| async move { Ok(NodeOutput::Update(say("step one done"))) });
    g.add_node("stuck", |_s: Arc<Chat>, _c: Ctx| async move {
        std::future::pending::<()>().await;
        Ok(NodeOutput::Update(say("never")))
    });
    g.add_edge(START, "first").add_edge("first", "stuck").add_edge("stuck", END);
    let g = g.compile(Deps::default(), b.open().await).unwrap();
    let cancel = tokio_util::sync::CancellationToken::new();
    let mut run =
        g.start(&thread(9), say("go"), RunOptions { cancel: cancel.clone(), ..RunOptions::default() }).await.unwrap();
    while let Some(e) = run.next_event().await {
        if matches!(e, RunEvent::NodeStarted { ref node, .. } if node == "stuck") {
            break;
        }
    }
    // Another process reads the thread while the run is stuck inside a node.
    let reader = echo_graph(b.open().await);
    let head = reader.thread_state(&thread(9)).await.unwrap().unwrap();
    assert_eq!(head.state.log, ["go", "step one done"]);
    assert_eq!(head.next.as_deref(), Some("stuck"));
    cancel.cancel();
    assert!(matches!(run.outcome().await, RunOutcome::Cancelled { .. }));
    assert!(g.thread_state(&thread(9)).await.unwrap().unwrap().next.is_none(), "cancel leaves the thread idle");
}

async fn tenant_data_can_be_deleted(b: &Backend) {
    let store = b.open().await;
    let g = echo_graph(store.clone());
    for t in [ThreadId::new("acme", 1), ThreadId::new("acme", 2), ThreadId::new("other", 1)] {
        g.start(&t, say("x"), RunOptions::default()).await.unwrap().outcome().await;
    }
    assert_eq!(store.delete_thread(&ThreadId::new("acme", 2)).await.unwrap(), 2);
    assert_eq!(store.delete_namespace("acme").await.unwrap(), 2);
    assert!(g.thread_state(&ThreadId::new("acme", 1)).await.unwrap().is_none());
    assert!(g.thread_state(&ThreadId::new("other", 1)).await.unwrap().is_some());
}

async fn records_of_an_older_format_still_load_and_newer_ones_are_refused(b: &Backend) {
    let store = b.open().await;
    let t = thread(10);
    // Exactly what format 1 writes for a paused run (field defaults omitted).
    let v1: CheckpointRecord = serde_json::from_str(
        r#"{"seq":1,"run_id":"r1","kind":"input","next":"plan","updates":[{"log":["hola"]}],"created_at_ms":1}"#,
    )
    .unwrap();
    assert_eq!(v1.format, 1);
    store.append(&t, &v1).await.unwrap();
    let g = echo_graph(store.clone());
    assert_eq!(g.thread_state(&t).await.unwrap().unwrap().state.log, ["hola"]);
    let mut future = v1.clone();
    future.seq = 2;
    future.format = 99;
    store.append(&t, &future).await.unwrap();
    let err = g.thread_state(&t).await.unwrap_err();
    assert!(err.to_string().contains("format 99"), "{err}");
    // Appending out of order is a conflict.
    let mut gap = v1;
    gap.seq = 7;
    assert!(matches!(store.append(&t, &gap).await, Err(CheckpointError::Conflict { seq: 7, .. })));
}

async fn cached_heads_see_other_replicas_and_deletions(b: &Backend) {
    let store1 = b.open().await;
    let g1 = echo_graph(store1.clone());
    let g2 = echo_graph(b.open().await);
    g1.start(&thread(11), say("a"), RunOptions::default()).await.unwrap().outcome().await;
    g2.start(&thread(11), say("b"), RunOptions::default()).await.unwrap().outcome().await;
    let out = g1.start(&thread(11), say("c"), RunOptions::default()).await.unwrap().outcome().await;
    assert_eq!(out.state().log, ["a", "echo: a", "b", "echo: b", "c", "echo: c"], "g1 caught up with g2's turn");
    store1.delete_thread(&thread(11)).await.unwrap();
    g2.start(&thread(11), say("fresh"), RunOptions::default()).await.unwrap().outcome().await;
    let out = g1.start(&thread(11), say("again"), RunOptions::default()).await.unwrap().outcome().await;
    assert_eq!(out.state().log, ["fresh", "echo: fresh", "again", "echo: again"], "no stale cached state");
}

/// A resumed run whose first checkpoint the store refuses has recorded nothing: the pause
/// and its decisions stand, marked waiting again (a new turn is refused; the thread's owner,
/// closing dead runs, finds none), and resuming again applies them.
async fn a_resumed_run_that_cannot_checkpoint_leaves_its_decisions_to_apply(b: &Backend) {
    use toolgraph_testkit::faulty_store::{FaultyCheckpointer, WriteFault};
    let t = thread(31);
    let store = Arc::new(FaultyCheckpointer::new(b.open().await));
    let g = approval_graph(store.clone());
    let (_, out) = g.start(&t, say("plan"), RunOptions::default()).await.unwrap().collect().await;
    let RunOutcome::Interrupted { pending, .. } = out else { panic!("{out:?}") };
    let decisions: BTreeMap<InterruptId, Decision> =
        pending.iter().map(|p| (p.id.clone(), Decision::Approve)).collect();
    // The decisions' record is written; the resume node's step is refused.
    store.set(WriteFault::Nth(2));
    let ResumeResult::Started(run) = g.resume(&t, decisions.clone(), opts_owned()).await.unwrap() else {
        panic!("every interrupt was decided")
    };
    let (_, out) = run.collect().await;
    assert!(matches!(out, RunOutcome::Failed { error: GraphError::Checkpoint(_), .. }), "{out:?}");
    store.set(WriteFault::None);
    let refused = g.start(&t, say("next"), opts_owned()).await.err();
    assert!(matches!(refused, Some(GraphError::AwaitingDecision { pending: 2, .. })), "{refused:?}");
    let paused_by = store.load(&t, Some(2)).await.unwrap().last().unwrap().run_id.clone();
    let records = store.load(&t, None).await.unwrap();
    let mark = records.last().unwrap();
    assert_eq!((mark.kind, &mark.run_id), (RecordKind::Decision, &paused_by), "{records:?}");
    assert!(mark.reason.as_deref().is_some_and(|r| r.contains("checkpoint")), "{:?}", mark.reason);
    let ends: Vec<RunEnd> = recorded_runs(&records).into_iter().map(|r| r.end).collect();
    assert_eq!(ends[0], RunEnd::Paused { waiting: true }, "the pause waits again: {ends:?}");
    assert!(matches!(&ends[1], RunEnd::Failed(Some(_))), "{ends:?}");
    assert!(!g.close_interrupted(&t).await.unwrap(), "a reopened pause is left alone");
    let refused = g.start(&t, say("next"), opts_owned()).await.err();
    assert!(matches!(refused, Some(GraphError::AwaitingDecision { pending: 2, .. })), "{refused:?}");
    let ResumeResult::Started(run) = g.resume(&t, decisions, opts_owned()).await.unwrap() else {
        panic!("the decisions stand")
    };
    let (_, out) = run.collect().await;
    let RunOutcome::Completed { state } = out else { panic!("{out:?}") };
    assert_eq!(state.decided.len(), 2, "applied once, as recorded: {:?}", state.decided);
}

/// `approval_graph` over a fault-injecting store of `b`, paused on `t` by the plan `said`, then
/// resumed by a run that wrote its decisions and nothing more (the store refused its step and
/// the mark after, as a process that died there leaves it): the store, the graph, the pausing
/// run's id, and the decisions (every action approved).
async fn paused_and_a_resume_that_died(
    b: &Backend,
    t: &ThreadId,
    said: &str,
) -> (
    Arc<toolgraph_testkit::faulty_store::FaultyCheckpointer>,
    CompiledGraph<Chat, Deps>,
    String,
    BTreeMap<InterruptId, Decision>,
) {
    use toolgraph_testkit::faulty_store::{FaultyCheckpointer, WriteFault};
    let store = Arc::new(FaultyCheckpointer::new(b.open().await));
    let g = approval_graph(store.clone());
    let (_, out) = g.start(t, say(said), RunOptions::default()).await.unwrap().collect().await;
    let RunOutcome::Interrupted { pending, .. } = out else { panic!("{out:?}") };
    let paused_by = store.load(t, None).await.unwrap().last().unwrap().run_id.clone();
    let decisions: BTreeMap<InterruptId, Decision> =
        pending.iter().map(|p| (p.id.clone(), Decision::Approve)).collect();
    store.set(WriteFault::From(2));
    let ResumeResult::Started(run) = g.resume(t, decisions.clone(), opts_owned()).await.unwrap() else {
        panic!("every interrupt was decided")
    };
    run.collect().await;
    store.set(WriteFault::None);
    (store, g, paused_by, decisions)
}

/// The decisions of `t`'s reopened pause resumed by a caller that does not own the thread (no
/// run holds the pause), and applied once.
async fn applied_once_by_any_caller(
    g: &CompiledGraph<Chat, Deps>,
    t: &ThreadId,
    decisions: BTreeMap<InterruptId, Decision>,
) {
    let ResumeResult::Started(run) = g.resume(t, decisions, RunOptions::default()).await.unwrap() else {
        panic!("the decisions stand")
    };
    let RunOutcome::Completed { state } = run.collect().await.1 else { panic!("completed") };
    assert_eq!(state.decided.len(), 2, "applied once: {:?}", state.decided);
}

/// A resume cancelled before its first step ends — even one after a resume that died having
/// written only its decisions — leaves the pause to its own run again: the mark is under the
/// pausing run (whose pending actions are found by it), the cancelled run's records say
/// cancelled, and the same decisions resume it at once, by any caller, applied once.
async fn a_resume_cancelled_before_its_first_step_leaves_the_pause_to_its_run(b: &Backend) {
    let t = thread(33);
    let (store, g, paused_by, decisions) = paused_and_a_resume_that_died(b, &t, "plan it slowly").await;
    // The next is cancelled while its first node (`apply`, slow the second time) runs.
    let cancel = tokio_util::sync::CancellationToken::new();
    let opts = RunOptions { cancel: cancel.clone(), ..opts_owned() };
    let ResumeResult::Started(run) = g.resume(&t, decisions.clone(), opts).await.unwrap() else {
        panic!("the decisions stand")
    };
    let cancelled_run = run.run_id().to_owned();
    tokio::time::sleep(Duration::from_millis(100)).await;
    cancel.cancel();
    let (_, out) = run.collect().await;
    assert!(matches!(out, RunOutcome::Cancelled { .. }), "{out:?}");
    let records = store.load(&t, None).await.unwrap();
    let mark = records.last().unwrap();
    assert_eq!((mark.kind, mark.reason.as_deref()), (RecordKind::Decision, Some("cancelled")));
    assert_eq!(mark.run_id, paused_by, "under the pausing run, not the resume that died");
    let ends: Vec<(String, RunEnd)> = recorded_runs(&records).into_iter().map(|r| (r.run_id, r.end)).collect();
    assert_eq!(ends.first(), Some(&(paused_by.clone(), RunEnd::Paused { waiting: true })), "{ends:?}");
    assert_eq!(ends.last(), Some(&(cancelled_run, RunEnd::Cancelled)), "{ends:?}");
    applied_once_by_any_caller(&g, &t, decisions).await;
}

/// A resume that wrote its decisions and nothing more (the store refused its step and the mark
/// after, as a process that died there would leave it) is closed by the thread's owner: the
/// pause waits again under its own run, the resume failed, and the same decisions apply once.
async fn a_resume_that_stopped_before_its_first_step_is_reopened_by_the_threads_owner(b: &Backend) {
    let t = thread(34);
    let (store, g, paused_by, decisions) = paused_and_a_resume_that_died(b, &t, "plan").await;
    assert_eq!(store.load(&t, None).await.unwrap().last().unwrap().kind, RecordKind::Decision);
    assert!(g.close_interrupted(&t).await.unwrap(), "the resume that stopped before its first step is closed");
    let records = store.load(&t, None).await.unwrap();
    let mark = records.last().unwrap();
    assert_eq!(
        (mark.kind, mark.reason.as_deref(), &mark.run_id),
        (RecordKind::Decision, Some(INTERRUPTED), &paused_by)
    );
    let ends: Vec<RunEnd> = recorded_runs(&records).into_iter().map(|r| r.end).collect();
    assert_eq!(ends, [RunEnd::Paused { waiting: true }, RunEnd::Failed(None)], "the pause waits again");
    assert!(!g.close_interrupted(&t).await.unwrap(), "a reopened pause is left alone");
    applied_once_by_any_caller(&g, &t, decisions).await;
}

/// A run that fails is closed with the recovery's update over the state the store has — not
/// over its memory, which holds the step whose checkpoint failed.
async fn a_failed_run_is_closed_over_the_stored_state(b: &Backend) {
    use toolgraph_testkit::faulty_store::{FaultyCheckpointer, WriteFault};
    let t = thread(32);
    let store = Arc::new(FaultyCheckpointer::new(b.open().await));
    let mut g = StateGraph::<Chat, Deps>::new();
    g.add_node("work", |_s: Arc<Chat>, _c: Ctx| async move { Ok(NodeOutput::Update(say("worked"))) });
    g.add_edge(START, "work").add_edge("work", END);
    g.set_recovery(|s: &Chat, cause| Some(say(&format!("{cause:?} after {}", s.log.join("+")))));
    let g = g.compile(Deps::default(), store.clone()).unwrap();
    // The input is written; the step is refused.
    store.set(WriteFault::Nth(2));
    let (_, out) = g.start(&t, say("hola"), RunOptions::default()).await.unwrap().collect().await;
    assert!(matches!(out, RunOutcome::Failed { .. }), "{out:?}");
    let state = g.thread_state(&t).await.unwrap().unwrap();
    assert_eq!(state.state.log, ["hola", "Failed after hola"]);
    assert!(state.next.is_none(), "the thread is idle");
}

/// A long thread is read from the head a process knows: only the records written since it
/// (by this process or another) — for its state, a checkpoint at or after that head, and its
/// recorded runs; a history of states reads it once. Every answer is the whole fold's.
async fn a_long_thread_is_read_from_the_head_a_process_knows(b: &Backend) {
    use toolgraph_testkit::faulty_store::FaultyCheckpointer;
    let t = thread(50);
    let store = b.open().await;
    let writer = echo_graph(store.clone());
    for i in 0..30 {
        writer.start(&t, say(&format!("turn {i}")), RunOptions::default()).await.unwrap().outcome().await;
    }
    let counted = Arc::new(FaultyCheckpointer::new(store.clone()));
    let reader = echo_graph(counted.clone());
    let whole = |g: CompiledGraph<Chat, Deps>| async move { g.thread_state(&thread(50)).await.unwrap().unwrap() };

    // A process that never saw the thread reads it whole, once.
    let head = reader.thread_state(&t).await.unwrap().unwrap();
    assert_eq!((head.version, counted.take_records_read()), (60, 60));
    assert_eq!(reader.thread_state(&t).await.unwrap().unwrap().version, 60);
    assert_eq!(counted.take_records_read(), 0, "nothing written since: the head is current");
    let read_whole = whole(echo_graph(b.open().await)).await;
    assert_eq!(reader.state_at(&t, 60).await.unwrap().state, read_whole.state);
    assert_eq!(counted.take_records_read(), 1, "the head's own record, to check it");
    assert!(matches!(reader.state_at(&t, 61).await, Err(GraphError::NotFound { seq: Some(61), .. })));
    assert_eq!(counted.take_records_read(), 1, "past the head: not written yet");

    // Another process writes a turn: the reader reads those two records (and the one it knew).
    writer.start(&t, say("turn 30"), RunOptions::default()).await.unwrap().outcome().await;
    let caught_up = reader.state_at(&t, 62).await.unwrap();
    assert_eq!(counted.take_records_read(), 3);
    let fresh = whole(echo_graph(b.open().await)).await;
    assert_eq!((caught_up.version, &caught_up.state), (62, &fresh.state));
    assert_eq!(reader.thread_state(&t).await.unwrap().unwrap().state, fresh.state);
    assert_eq!(counted.take_records_read(), 0, "the caught-up head was kept");
    // A checkpoint before the known head is folded from the first record.
    let earlier = reader.state_at(&t, 61).await.unwrap();
    assert_eq!(earlier.state.log.last().map(String::as_str), Some("turn 30"));
    assert_eq!(counted.take_records_read(), 61);

    // A history of states: the thread read once, each state the one its checkpoint left.
    let seqs = [62, 2, 31, 61, 2];
    let states = reader.states_at(&t, &seqs).await.unwrap();
    assert_eq!(counted.take_records_read(), 62);
    let solo = echo_graph(b.open().await);
    for (seq, state) in seqs.iter().zip(&states) {
        let alone = solo.state_at(&t, *seq).await.unwrap();
        assert_eq!((state.version, &state.state, &state.next), (*seq, &alone.state, &alone.next));
    }
    assert!(matches!(reader.states_at(&t, &[3, 63]).await, Err(GraphError::NotFound { seq: Some(63), .. })));
    counted.take_records_read();

    // Its runs: read whole once, then only what was written since.
    let ends = |runs: &[RecordedRun]| runs.iter().map(|r| (r.run_id.clone(), r.end.clone())).collect::<Vec<_>>();
    let runs = reader.recorded_runs(&t).await.unwrap();
    assert_eq!((runs.len(), counted.take_records_read()), (31, 62));
    assert_eq!(reader.recorded_runs(&t).await.unwrap().len(), 31);
    assert_eq!(counted.take_records_read(), 0);
    writer.start(&t, say("turn 31"), RunOptions::default()).await.unwrap().outcome().await;
    let runs = reader.recorded_runs(&t).await.unwrap();
    assert_eq!(counted.take_records_read(), 3);
    assert_eq!(ends(&runs), ends(&recorded_runs(&store.load(&t, None).await.unwrap())));
    assert_eq!(runs.last().map(|r| &r.end), Some(&RunEnd::Finished));

    // Deleted and written again to the same number: nothing stale is kept.
    store.delete_thread(&t).await.unwrap();
    for i in 0..32 {
        writer.start(&t, say(&format!("again {i}")), RunOptions::default()).await.unwrap().outcome().await;
    }
    let runs = reader.recorded_runs(&t).await.unwrap();
    assert_eq!(ends(&runs), ends(&recorded_runs(&store.load(&t, None).await.unwrap())));
    let now = reader.state_at(&t, 64).await.unwrap();
    assert_eq!(now.state.log.first().map(String::as_str), Some("again 0"));
    assert_eq!(reader.thread_state(&t).await.unwrap().unwrap().state, now.state);
}

/// Runs as `(id, end, started, updated, metadata)`: all a run record says.
fn runs_said(runs: &[RecordedRun]) -> Vec<(String, RunEnd, i64, i64, Option<String>)> {
    runs.iter()
        .map(|r| {
            let metadata = r.metadata.as_ref().map(|m| m.get().to_owned());
            (r.run_id.clone(), r.end.clone(), r.started_at_ms, r.updated_at_ms, metadata)
        })
        .collect()
}

/// A thread's runs and state read by a process that keeps them folded say what a whole reading
/// says, across a pause decided in two requests, a resume, a compaction by another process and
/// a rollback — and a reading that found its kept head or runs stale keeps what it read.
async fn what_a_process_keeps_of_a_thread_follows_pauses_compaction_and_rollback(b: &Backend) {
    use toolgraph_testkit::faulty_store::FaultyCheckpointer;
    let t = thread(51);
    let store = b.open().await;
    let writer = approval_graph(store.clone());
    let counted = Arc::new(FaultyCheckpointer::new(store.clone()));
    let reader = approval_graph(counted.clone());
    let check = |said: Vec<RecordedRun>, whole: Vec<RecordedRun>, when: &str| {
        assert_eq!(runs_said(&said), runs_said(&whole), "{when}");
    };
    let metadata = serde_json::value::RawValue::from_string(r#"{"by":"test"}"#.into()).ok();
    let opts = RunOptions { metadata, ..Default::default() };
    let out = writer.start(&t, say("do both"), opts).await.unwrap().outcome().await;
    let RunOutcome::Interrupted { pending, .. } = out else { panic!("{out:?}") };
    check(reader.recorded_runs(&t).await.unwrap(), recorded_runs(&store.load(&t, None).await.unwrap()), "paused");
    let decide = |p: &PendingInterrupt| BTreeMap::from([(p.id.clone(), Decision::Approve)]);
    writer.record_decisions(&t, decide(&pending[0])).await.unwrap();
    check(
        reader.recorded_runs(&t).await.unwrap(),
        recorded_runs(&store.load(&t, None).await.unwrap()),
        "one decision recorded",
    );
    counted.take_records_read();
    let ResumeResult::Started(run) = writer.resume(&t, decide(&pending[1]), RunOptions::default()).await.unwrap()
    else {
        panic!("the last decision resumes")
    };
    run.outcome().await;
    let runs = reader.recorded_runs(&t).await.unwrap();
    assert!(counted.take_records_read() < 4, "the records since only");
    assert_eq!(runs.len(), 2, "{:?}", runs_said(&runs));
    assert_eq!(runs[0].end, RunEnd::Paused { waiting: false });
    assert_eq!(runs[1].end, RunEnd::Finished);
    check(runs, recorded_runs(&store.load(&t, None).await.unwrap()), "resumed");
    let head = reader.thread_state(&t).await.unwrap().unwrap();

    // Another process compacts the thread: its first runs are no longer recorded, here either.
    let records = store.load(&t, None).await.unwrap().len() as u64;
    assert!(store.compact_thread(&t, 1).await.unwrap() > 0, "{records} records");
    let compacted = reader.recorded_runs(&t).await.unwrap();
    check(compacted, recorded_runs(&store.load(&t, None).await.unwrap()), "compacted");
    assert_eq!(reader.thread_state(&t).await.unwrap().unwrap().state, head.state, "the same state");

    // Rolled back past the head the reader keeps: it reads the thread whole once, then keeps that.
    writer.start(&t, say("plan again"), RunOptions::default()).await.unwrap().outcome().await;
    let before = reader.thread_state(&t).await.unwrap().unwrap();
    reader.recorded_runs(&t).await.unwrap();
    let kept = store.load(&t, None).await.unwrap()[0].seq;
    assert!(store.truncate_thread(&t, kept).await.unwrap() > 0);
    counted.take_records_read();
    let after = reader.thread_state(&t).await.unwrap().unwrap();
    assert!(after.version < before.version);
    assert_eq!(after.state, head.state, "as it was before the last turn");
    check(reader.recorded_runs(&t).await.unwrap(), recorded_runs(&store.load(&t, None).await.unwrap()), "rolled back");
    counted.take_records_read();
    assert_eq!(reader.thread_state(&t).await.unwrap().unwrap().version, after.version);
    reader.recorded_runs(&t).await.unwrap();
    assert_eq!(counted.take_records_read(), 0, "what was read after the rollback was kept");
}

macro_rules! suite {
    ($backend:ident) => {
        mod $backend {
            use super::*;
            macro_rules! case {
                ($name:ident) => {
                    #[tokio::test]
                    async fn $name() {
                        let Some(b) = Backend::new(stringify!($backend)).await else {
                            return;
                        };
                        super::$name(&b).await;
                    }
                };
            }
            case!(multi_turn_persists_and_resumes_in_a_new_process);
            case!(a_run_that_died_mid_way_is_closed_and_the_thread_goes_on);
            case!(two_interrupts_resume_each_to_its_own_call_and_nothing_repeats);
            case!(recursion_limit_ends_the_run_with_a_defined_outcome);
            case!(a_panicking_node_fails_the_run_not_the_process);
            case!(concurrent_runs_on_one_thread_never_interleave);
            case!(fork_from_an_earlier_checkpoint);
            case!(a_state_update_is_a_step_of_the_node_it_names_and_the_next_turn_reads_it);
            case!(a_finished_thread_is_compacted_to_its_last_checkpoints_which_read_the_same);
            case!(a_paused_thread_is_not_compacted_nor_a_decision_kept_first);
            case!(a_truncated_thread_reads_as_before_its_last_run_here_and_in_a_cached_graph);
            case!(storage_grows_linearly);
            case!(the_last_complete_checkpoint_is_readable_mid_step);
            case!(tenant_data_can_be_deleted);
            case!(records_of_an_older_format_still_load_and_newer_ones_are_refused);
            case!(cached_heads_see_other_replicas_and_deletions);
            case!(a_resumed_run_that_cannot_checkpoint_leaves_its_decisions_to_apply);
            case!(a_failed_run_is_closed_over_the_stored_state);
            case!(a_resume_cancelled_before_its_first_step_leaves_the_pause_to_its_run);
            case!(a_resume_that_stopped_before_its_first_step_is_reopened_by_the_threads_owner);
            case!(a_long_thread_is_read_from_the_head_a_process_knows);
            case!(what_a_process_keeps_of_a_thread_follows_pauses_compaction_and_rollback);
        }
    };
}

suite!(memory);
suite!(sqlite);
suite!(postgres);
