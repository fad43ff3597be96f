//! The runs a thread's checkpoints record: which runs wrote them, when, and how each ended.
//!
//! Every run leaves its id on each record it writes, begins with an input record (a new turn)
//! or a decision record that resumed a pause, and ends on a record that says how: a step with
//! nothing next, a pause, or a stop with its reason. So the store that every replica shares
//! tells any of them, long after the run, what became of it; nothing else has to be kept.

use super::{CheckpointRecord, RecordKind};
use crate::interrupt::InterruptId;
use serde_json::value::RawValue;
use std::collections::BTreeSet;

/// How a recorded run stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEnd {
    /// Its last record has a node still to run and nothing came after it: running (on this
    /// replica or another), unless its process died and nobody has closed it yet.
    Running,
    /// It reached the end of the graph.
    Finished,
    /// It paused for decisions; `waiting` while the thread still waits on that pause (a later
    /// run that resumed it clears it).
    Paused {
        /// The thread's pause is this run's.
        waiting: bool,
    },
    /// A caller cancelled it.
    Cancelled,
    /// It stopped early: a failure, the recursion limit (the stop's reason), or it died
    /// mid-way and was closed (`None`: the thread went on without it, or a mark reopened the
    /// pause it resumed).
    Failed(Option<String>),
}

/// One run as the thread's checkpoints record it.
#[derive(Debug, Clone)]
pub struct RecordedRun {
    /// The run's id, as its records carry it.
    pub run_id: String,
    /// When its first record was written (ms since the Unix epoch).
    pub started_at_ms: i64,
    /// When its last record was written.
    pub updated_at_ms: i64,
    /// How it stands.
    pub end: RunEnd,
    /// What its caller said of it when it started ([`RunOptions::metadata`](crate::RunOptions::metadata)).
    pub metadata: Option<Box<RawValue>>,
}

/// The reason a cancelled run's stop record gives.
pub(crate) const CANCELLED: &str = "cancelled";

/// The reason recorded when a run that stopped mid-way is closed.
pub const INTERRUPTED: &str = "interrupted: the run stopped without finishing (its process ended)";

/// The runs that `records` (a thread's, oldest first) record, oldest first.
///
/// Records of no run are skipped: a state update written from outside any run, a decision
/// that left others still to make, the stop that closes a dead run or marks a fork. A thread
/// compacted past a run's first record no longer shows that run.
pub fn recorded_runs(records: &[CheckpointRecord]) -> Vec<RecordedRun> {
    let mut fold = RunsFold::default();
    fold.extend(records);
    fold.runs
}

/// [`recorded_runs`] as a fold that takes a thread's records as they come: a reader that keeps
/// it reads only the records written since (docs/graph.md, "History and replay").
#[derive(Debug, Clone, Default)]
pub(crate) struct RunsFold {
    runs: Vec<RecordedRun>,
    /// The pause the thread is in, and which of its interrupts are decided.
    pending: BTreeSet<InterruptId>,
    decided: BTreeSet<InterruptId>,
    /// The last record folded: its number and run (decisions recorded without resuming are
    /// written under the id of the record before; with the number, it tells a reader whether
    /// the store still holds what was folded).
    last: Option<(u64, String)>,
    /// The number of the first record folded: a thread compacted since starts later.
    first: Option<u64>,
}

impl RunsFold {
    /// The runs folded so far, oldest first.
    pub fn runs(&self) -> &[RecordedRun] {
        &self.runs
    }

    /// The number and run id of the last record folded.
    pub fn last(&self) -> Option<(u64, &str)> {
        self.last.as_ref().map(|(seq, run)| (*seq, run.as_str()))
    }

    /// Whether the first record folded is number `first` (a thread compacted since the fold
    /// began starts later).
    pub fn starts_at(&self, first: u64) -> bool {
        self.first == Some(first)
    }

    /// Folds `records`, the thread's next ones, oldest first.
    pub fn extend<'a>(&mut self, records: impl IntoIterator<Item = &'a CheckpointRecord>) {
        for record in records {
            self.push(record);
            self.first.get_or_insert(record.seq);
            self.last = Some((record.seq, record.run_id.clone()));
        }
    }

    fn push(&mut self, record: &CheckpointRecord) {
        let runs = &mut self.runs;
        let before = self.last.as_ref().map(|(_, run)| run.as_str());
        // A resume that ended before its first step (cancelled, or dead and closed): it ends,
        // and the pause it took over waits again (the mark is under the pause's run, so the
        // decisions resume it).
        if record.kind == RecordKind::Decision && record.reason.is_some() {
            if let Some(resume) = runs.last_mut().filter(|r| r.end == RunEnd::Running) {
                resume.end = match record.reason.as_deref() {
                    Some(CANCELLED) => RunEnd::Cancelled,
                    Some(INTERRUPTED) | None => RunEnd::Failed(None),
                    Some(failure) => RunEnd::Failed(Some(failure.to_owned())),
                };
                resume.updated_at_ms = record.created_at_ms;
            }
            if let Some(paused) = runs.iter_mut().rev().find(|r| r.run_id == record.run_id)
                && let RunEnd::Paused { waiting } = &mut paused.end
            {
                *waiting = true;
            }
            return;
        }
        // Runs go one at a time: a run still running when another writes has stopped
        // writing for good (its process died, and the thread was closed or moved on).
        if let Some(last) = runs.last_mut()
            && last.end == RunEnd::Running
            && last.run_id != record.run_id
        {
            last.end = RunEnd::Failed(None);
        }
        let follows = before == Some(record.run_id.as_str());
        let own = runs.last_mut().filter(|r| r.run_id == record.run_id);
        match record.kind {
            RecordKind::Input => {
                self.pending.clear();
                self.decided.clear();
                settle_pause(runs);
                runs.push(begun(record));
            }
            RecordKind::Decision => {
                self.decided.extend(record.decisions.keys().cloned());
                match own {
                    // More decisions on its own pause (recorded, the run not continued).
                    Some(run) => run.updated_at_ms = record.created_at_ms,
                    // The last decisions of the pause, under an id of its own: this run resumes
                    // it (recorded only, they carry the id of the record before).
                    None if !follows
                        && !self.pending.is_empty()
                        && self.pending.iter().all(|p| self.decided.contains(p)) =>
                    {
                        settle_pause(runs);
                        runs.push(begun(record));
                    }
                    // Decisions with others still to make: no run yet.
                    None => {}
                }
            }
            RecordKind::Step | RecordKind::Interrupt | RecordKind::Stop => {
                self.pending.clear();
                self.decided.clear();
                if record.kind == RecordKind::Interrupt {
                    self.pending.extend(record.interrupts.iter().map(|i| i.id.clone()));
                }
                // Another id's step is a state update from outside any run; another id's stop
                // closes a dead run (handled above) or marks a fork.
                let Some(run) = own else { return };
                run.updated_at_ms = record.created_at_ms;
                run.end = match record.kind {
                    RecordKind::Interrupt => RunEnd::Paused { waiting: true },
                    RecordKind::Stop if record.reason.as_deref() == Some(CANCELLED) => RunEnd::Cancelled,
                    RecordKind::Stop => RunEnd::Failed(record.reason.clone()),
                    _ if record.next.is_none() => RunEnd::Finished,
                    _ => RunEnd::Running,
                };
            }
        }
    }
}

/// A run that begins with `record`.
fn begun(record: &CheckpointRecord) -> RecordedRun {
    RecordedRun {
        run_id: record.run_id.clone(),
        started_at_ms: record.created_at_ms,
        updated_at_ms: record.created_at_ms,
        end: if record.next.is_some() { RunEnd::Running } else { RunEnd::Finished },
        metadata: record.metadata.clone(),
    }
}

/// A new run starts: the pause before it, if any, no longer waits (the last run that paused:
/// resumes cancelled before their first step may have come after it).
fn settle_pause(runs: &mut [RecordedRun]) {
    let last_pause = runs.iter_mut().rev().find_map(|r| match &mut r.end {
        RunEnd::Paused { waiting } => Some(waiting),
        _ => None,
    });
    if let Some(waiting) = last_pause {
        *waiting = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interrupt::{Decision, PendingInterrupt};
    use std::collections::BTreeMap;

    fn record(seq: u64, run: &str, kind: RecordKind, next: Option<&str>) -> CheckpointRecord {
        CheckpointRecord {
            seq,
            format: super::super::FORMAT_VERSION,
            run_id: run.into(),
            kind,
            node: None,
            next: next.map(str::to_owned),
            updates: Vec::new(),
            interrupts: Vec::new(),
            decisions: BTreeMap::new(),
            reason: None,
            metadata: None,
            graph_version: None,
            created_at_ms: 1_000 + seq as i64,
        }
    }

    fn paused(seq: u64, run: &str, ids: &[&str]) -> CheckpointRecord {
        let mut r = record(seq, run, RecordKind::Interrupt, Some("tools"));
        r.interrupts = ids
            .iter()
            .map(|id| PendingInterrupt {
                id: InterruptId((*id).into()),
                key: (*id).into(),
                payload: serde_json::Value::Null,
            })
            .collect();
        r
    }

    fn decided(seq: u64, run: &str, ids: &[&str]) -> CheckpointRecord {
        let mut r = record(seq, run, RecordKind::Decision, Some("tools"));
        r.decisions = ids.iter().map(|id| (InterruptId((*id).into()), Decision::Approve)).collect();
        r
    }

    fn stopped(seq: u64, run: &str, reason: &str) -> CheckpointRecord {
        let mut r = record(seq, run, RecordKind::Stop, None);
        r.reason = Some(reason.into());
        r
    }

    fn ends(records: &[CheckpointRecord]) -> Vec<(String, RunEnd)> {
        recorded_runs(records).into_iter().map(|r| (r.run_id, r.end)).collect()
    }

    fn end(run: &str, end: RunEnd) -> (String, RunEnd) {
        (run.to_owned(), end)
    }

    #[test]
    fn a_finished_run_and_a_running_one_with_their_times_and_metadata() {
        let mut input = record(1, "a", RecordKind::Input, Some("agent"));
        input.metadata = RawValue::from_string(r#"{"by":"door"}"#.into()).ok();
        let records = [
            input,
            record(2, "a", RecordKind::Step, None),
            record(3, "b", RecordKind::Input, Some("agent")),
            record(4, "b", RecordKind::Step, Some("tools")),
        ];
        let runs = recorded_runs(&records);
        assert_eq!(runs.len(), 2);
        assert_eq!((runs[0].started_at_ms, runs[0].updated_at_ms), (1_001, 1_002));
        assert_eq!(runs[0].metadata.as_ref().map(|m| m.get()), Some(r#"{"by":"door"}"#));
        assert!(runs[1].metadata.is_none());
        assert_eq!(ends(&records), [end("a", RunEnd::Finished), end("b", RunEnd::Running)]);
    }

    #[test]
    fn a_pause_waits_until_a_run_resumes_it_and_partial_decisions_start_no_run() {
        let records = [
            record(1, "a", RecordKind::Input, Some("agent")),
            paused(2, "a", &["i1", "i2"]),
            // Recorded on the pausing run's own id: the pause is still that run's.
            decided(3, "a", &["i1"]),
        ];
        assert_eq!(ends(&records), [end("a", RunEnd::Paused { waiting: true })]);
        assert_eq!(recorded_runs(&records)[0].updated_at_ms, 1_003);
        // A resume with one decision still missing writes under its own id, and starts nothing.
        let mut more = records.to_vec();
        more.push(decided(4, "x", &[]));
        assert_eq!(ends(&more), [end("a", RunEnd::Paused { waiting: true })]);
        more.push(decided(5, "b", &["i2"]));
        assert_eq!(ends(&more), [end("a", RunEnd::Paused { waiting: false }), end("b", RunEnd::Running)]);
        more.push(record(6, "b", RecordKind::Step, None));
        assert_eq!(ends(&more)[1], end("b", RunEnd::Finished));
        // A partial resume under x, then the last decision recorded without resuming (under x,
        // the id of the record before): still no run, the pause still waits.
        let mut recorded_only = records[..2].to_vec();
        recorded_only.extend([decided(3, "x", &["i1"]), decided(4, "x", &["i2"])]);
        assert_eq!(ends(&recorded_only), [end("a", RunEnd::Paused { waiting: true })]);
        recorded_only.push(decided(5, "c", &[]));
        assert_eq!(ends(&recorded_only)[1], end("c", RunEnd::Running), "then resumed under an id of its own");
    }

    #[test]
    fn a_resume_cancelled_before_its_first_step_ends_and_its_pause_waits_again() {
        let mut cancelled = decided(4, "a", &[]);
        cancelled.reason = Some(CANCELLED.into());
        let mut records = vec![
            record(1, "a", RecordKind::Input, Some("agent")),
            paused(2, "a", &["i1"]),
            decided(3, "b", &["i1"]),
            // Written by b's cancel under the pause's run.
            cancelled,
        ];
        assert_eq!(ends(&records), [end("a", RunEnd::Paused { waiting: true }), end("b", RunEnd::Cancelled)]);
        assert_eq!(recorded_runs(&records)[1].updated_at_ms, 1_004);
        // Resumed again under an id of its own, with the decisions that stand.
        records.push(decided(5, "c", &[]));
        records.push(record(6, "c", RecordKind::Step, None));
        assert_eq!(
            ends(&records),
            [end("a", RunEnd::Paused { waiting: false }), end("b", RunEnd::Cancelled), end("c", RunEnd::Finished)]
        );
        // One whose process died there, closed by the thread's next owner: failed, the pause waits.
        let mut died = decided(4, "a", &[]);
        died.reason = Some(crate::INTERRUPTED.into());
        let records = [records[0].clone(), records[1].clone(), records[2].clone(), died];
        assert_eq!(ends(&records), [end("a", RunEnd::Paused { waiting: true }), end("b", RunEnd::Failed(None))]);
    }

    #[test]
    fn stops_say_cancelled_or_failed_and_a_dead_run_fails_when_the_thread_goes_on() {
        let records = [
            record(1, "a", RecordKind::Input, Some("agent")),
            stopped(2, "a", CANCELLED),
            record(3, "b", RecordKind::Input, Some("agent")),
            stopped(4, "b", "recursion limit"),
            record(5, "c", RecordKind::Input, Some("agent")),
            // c's process died; the next turn closed it under an id of its own, then began.
            stopped(6, "closer", crate::INTERRUPTED),
            record(7, "d", RecordKind::Input, None),
        ];
        assert_eq!(
            ends(&records),
            [
                end("a", RunEnd::Cancelled),
                end("b", RunEnd::Failed(Some("recursion limit".into()))),
                end("c", RunEnd::Failed(None)),
                end("d", RunEnd::Finished),
            ]
        );
    }

    #[test]
    fn a_state_update_from_outside_any_run_is_no_run() {
        let mut update = record(3, "u", RecordKind::Step, None);
        update.node = Some("agent".into());
        let records =
            [record(1, "a", RecordKind::Input, Some("agent")), record(2, "a", RecordKind::Step, None), update];
        assert_eq!(ends(&records), [end("a", RunEnd::Finished)]);
        assert_eq!(recorded_runs(&records)[0].updated_at_ms, 1_002, "the update is not the run's");
    }
}
