//! Parked holds: a granted hold whose machine has nothing to do before a
//! deadline (automatic renewal at a third of the TTL) stays with its guard,
//! whose calls run it inline as they run a hold that never renews, and one
//! task per [`Nodes`](crate::Nodes) and runtime ([`Alarms`]) wakes it at
//! the deadline by moving it to a task of its own, as every renewing hold
//! was moved at its grant before. A hold released before its first renewal
//! (most short holds) therefore costs no task, no channel and no hop
//! between tasks for the release.
//!
//! The alarm task keeps the deadlines in a heap, each with a weak handle
//! to its hold: a hold that is gone by its deadline is skipped, and one
//! whose deadline moved (a guard's `extend` ran it) is woken at the new
//! deadline, which its guard registered after the call. A registration
//! wakes the task only when it comes before the deadline the task sleeps
//! until; holds of one TTL register in order, so it seldom does.
//!
//! The task lives on the runtime that registered with it: a hold parked
//! from another runtime starts a task there (a timer belongs to the runtime
//! it was made in), and the earlier task serves what it holds, then ends.
//! When the runtime shuts down, the task goes with it, and the holds it
//! would have woken are not renewed: their TTL ends them, as it ended a
//! renewing hold's task before.

use crate::driver::{Call, Inline, OwnWork};
use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The alarm task of a [`Nodes`](crate::Nodes), started at its first
/// parked hold (see the module docs).
#[derive(Default)]
pub(crate) struct Alarms(Mutex<Option<AlarmTask>>);

impl std::fmt::Debug for Alarms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Alarms").finish_non_exhaustive()
    }
}

/// A running alarm task: its runtime, and what it shares with its holds.
struct AlarmTask {
    runtime: tokio::runtime::Id,
    shared: Arc<AlarmShared>,
}

/// The alarm task's deadlines and its wake-up call.
#[derive(Default)]
struct AlarmShared {
    heap: Mutex<AlarmHeap>,
    notify: Notify,
    /// The task has ended (its runtime shut down): register elsewhere.
    ended: AtomicBool,
}

#[derive(Default)]
struct AlarmHeap {
    alarms: BinaryHeap<Alarm>,
    /// The deadline the task sleeps until (`None`: it waits for a
    /// registration).
    armed: Option<Instant>,
    /// Registrations so far: ties between equal deadlines go in order.
    seq: u64,
    /// No registration comes any more (the `Nodes` is gone): the task ends
    /// once the holds it has are gone or woken.
    closed: bool,
}

/// A parked hold's deadline.
struct Alarm {
    at: Instant,
    seq: u64,
    parked: Weak<Parked>,
}

impl PartialEq for Alarm {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Alarm {}

impl PartialOrd for Alarm {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}

impl Ord for Alarm {
    /// The earliest first (the heap keeps its greatest on top).
    fn cmp(&self, other: &Self) -> CmpOrdering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

impl Alarms {
    /// Wake `parked` at `at`. `false` when there is no runtime to run an
    /// alarm task on.
    #[must_use = "no alarm is set without a runtime"]
    fn set(&self, at: Instant, parked: &Arc<Parked>) -> bool {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let id = runtime.id();
        let shared = {
            let mut slot = locked(&self.0);
            match &*slot {
                Some(task) if task.runtime == id && !task.shared.ended.load(Ordering::Acquire) => {
                    Arc::clone(&task.shared)
                }
                _ => {
                    if let Some(earlier) = slot.take() {
                        earlier.shared.close();
                    }
                    let shared = Arc::new(AlarmShared::default());
                    runtime.spawn(alarm_task(Arc::clone(&shared)));
                    *slot = Some(AlarmTask {
                        runtime: id,
                        shared: Arc::clone(&shared),
                    });
                    shared
                }
            }
        };
        shared.push(at, Arc::downgrade(parked));
        true
    }
}

impl Drop for Alarms {
    fn drop(&mut self) {
        if let Some(task) = locked(&self.0).take() {
            task.shared.close();
        }
    }
}

impl AlarmShared {
    fn push(&self, at: Instant, parked: Weak<Parked>) {
        let mut heap = locked(&self.heap);
        let seq = heap.seq;
        heap.seq = seq.wrapping_add(1);
        heap.alarms.push(Alarm { at, seq, parked });
        if heap.armed.is_none_or(|armed| at < armed) {
            heap.armed = Some(at);
            drop(heap);
            self.notify.notify_one();
        }
    }

    fn close(&self) {
        locked(&self.heap).closed = true;
        self.notify.notify_one();
    }
}

/// Marks its task ended when dropped: at its end, or with its runtime.
struct EndedOnDrop(Arc<AlarmShared>);

impl Drop for EndedOnDrop {
    fn drop(&mut self) {
        self.0.ended.store(true, Ordering::Release);
    }
}

/// The alarm task: wake each parked hold at its deadline. A plain function
/// returning the task's future, which owns its end marker from the start:
/// a task dropped with its runtime before it ever ran is marked ended too.
fn alarm_task(shared: Arc<AlarmShared>) -> impl std::future::Future<Output = ()> {
    let ended = EndedOnDrop(Arc::clone(&shared));
    async move {
        let _ended = ended;
        wake_due(&shared).await;
    }
}

async fn wake_due(shared: &AlarmShared) {
    let mut due = Vec::new();
    loop {
        let now = Instant::now();
        let next = {
            let mut heap = locked(&shared.heap);
            while heap.alarms.peek().is_some_and(|a| a.at <= now) {
                if let Some(alarm) = heap.alarms.pop() {
                    due.push(alarm.parked);
                }
            }
            if heap.closed {
                // Nobody registers any more: forget the holds that are gone.
                heap.alarms.retain(|a| a.parked.strong_count() > 0);
                if heap.alarms.is_empty() && due.is_empty() {
                    return;
                }
            }
            let next = heap.alarms.peek().map(|a| a.at);
            heap.armed = next;
            next
        };
        for parked in due.drain(..) {
            if let Some(parked) = parked.upgrade() {
                parked.wake(now);
            }
        }
        match next {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = shared.notify.notified() => {}
                }
            }
            None => shared.notify.notified().await,
        }
    }
}

/// A parked hold (see the module docs), shared by its guard and, weakly,
/// by the alarm that wakes it.
pub(crate) struct Parked {
    state: Mutex<State>,
    alarms: Arc<Alarms>,
}

impl std::fmt::Debug for Parked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parked").finish_non_exhaustive()
    }
}

enum State {
    /// Waiting for its deadline or the guard's next call.
    Here(Inline),
    /// Running a guard's call.
    Out,
    /// Moved to a task, reached through this channel.
    Task(mpsc::UnboundedSender<Call>),
}

/// What a guard's call finds ([`Parked::take`]).
pub(crate) enum Taken {
    /// The driver, to run the call inline.
    Here(Borrowed),
    /// The driver's task.
    Task(mpsc::UnboundedSender<Call>),
    /// No driver: another call has it out (not reached: a guard's calls
    /// take it `&mut`, one at a time, and put it back when they end or are
    /// cut short).
    Gone,
}

impl Parked {
    /// Park `inline`, whose next act is at `at`; `Err(inline)` back when
    /// no alarm can be set (no runtime).
    pub(crate) fn park(
        inline: Inline,
        at: Instant,
        alarms: &Arc<Alarms>,
    ) -> Result<Arc<Parked>, Inline> {
        let parked = Arc::new(Parked {
            state: Mutex::new(State::Here(inline)),
            alarms: Arc::clone(alarms),
        });
        if alarms.set(at, &parked) {
            return Ok(parked);
        }
        let state = std::mem::replace(&mut *locked(&parked.state), State::Out);
        match state {
            State::Here(inline) => Err(inline),
            // Not reached: nothing else has seen `parked`.
            State::Out | State::Task(_) => Err(Inline::none()),
        }
    }

    /// Take the driver for a guard's call.
    pub(crate) fn take(parked: &Arc<Parked>) -> Taken {
        let mut state = locked(&parked.state);
        match std::mem::replace(&mut *state, State::Out) {
            State::Here(inline) => Taken::Here(Borrowed {
                parked: Arc::clone(parked),
                inline: Some(inline),
            }),
            State::Task(ops) => {
                *state = State::Task(ops.clone());
                Taken::Task(ops)
            }
            State::Out => Taken::Gone,
        }
    }

    /// The alarm at `now`: move the driver to a task if its deadline has
    /// come (a guard's call may have moved it later, and registered the
    /// new one).
    fn wake(&self, now: Instant) {
        let mut state = locked(&self.state);
        let State::Here(inline) = &*state else {
            return;
        };
        match inline.own_work() {
            OwnWork::Deadline(at) if at > now => {}
            OwnWork::None => {}
            OwnWork::Deadline(_) | OwnWork::Requests => {
                if let State::Here(inline) = std::mem::replace(&mut *state, State::Out) {
                    *state = State::Task(inline.into_task());
                }
            }
        }
    }

    /// The driver is back from a guard's call: parked for its next
    /// deadline, kept for the next call, or moved to a task.
    fn put_back(self: &Arc<Parked>, inline: Inline) {
        let work = inline.own_work();
        let mut state = locked(&self.state);
        match work {
            OwnWork::Deadline(at) => {
                // In place before the alarm is set, so that an alarm due
                // at once finds it.
                *state = State::Here(inline);
                drop(state);
                // Without a runtime (a call cut short by dropping its future
                // outside one) no alarm can be set and no task can run: the
                // hold waits for its guard's next call, or its TTL ends it.
                let _ = self.alarms.set(at, self);
            }
            OwnWork::Requests if tokio::runtime::Handle::try_current().is_ok() => {
                *state = State::Task(inline.into_task());
            }
            OwnWork::None | OwnWork::Requests => *state = State::Here(inline),
        }
    }
}

/// The driver, out of its place for a guard's call; put back when dropped.
pub(crate) struct Borrowed {
    parked: Arc<Parked>,
    inline: Option<Inline>,
}

impl Borrowed {
    /// The driver.
    pub(crate) fn inline(&mut self) -> &mut Inline {
        self.inline.get_or_insert_with(Inline::none)
    }
}

impl Drop for Borrowed {
    fn drop(&mut self) {
        if let Some(inline) = self.inline.take() {
            self.parked.put_back(inline);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn task_of(alarms: &Alarms) -> Arc<AlarmShared> {
        let slot = locked(&alarms.0);
        let task = slot.as_ref().expect("an alarm task was started");
        Arc::clone(&task.shared)
    }

    #[test]
    fn the_heap_gives_the_earliest_deadline_first_and_ties_in_order() {
        let now = Instant::now();
        let mut heap = BinaryHeap::new();
        for (at, seq) in [(30, 0), (10, 1), (20, 2), (10, 3)] {
            heap.push(Alarm {
                at: now + Duration::from_millis(at),
                seq,
                parked: Weak::new(),
            });
        }
        let order: Vec<u64> = std::iter::from_fn(|| heap.pop().map(|a| a.seq)).collect();
        assert_eq!(order, [1, 3, 2, 0]);
    }

    #[tokio::test]
    async fn the_alarm_task_ends_once_its_nodes_and_holds_are_gone() {
        let alarms = Arc::new(Alarms::default());
        let later = Instant::now() + Duration::from_secs(3_600);
        let Ok(parked) = Parked::park(Inline::none(), later, &alarms) else {
            panic!("an alarm is set inside a runtime");
        };
        let task = task_of(&alarms);
        // The nodes go; a parked hold is still there: the task stays.
        drop(alarms);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!task.ended.load(Ordering::Acquire), "it still has a hold");
        // The hold goes too: the task forgets it and ends.
        drop(parked);
        task.notify.notify_one();
        for _ in 0..100 {
            if task.ended.load(Ordering::Acquire) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the alarm task did not end");
    }

    #[tokio::test]
    async fn a_runtime_of_its_own_starts_a_task_of_its_own() {
        let alarms = Arc::new(Alarms::default());
        let later = Instant::now() + Duration::from_secs(3_600);
        let first = Parked::park(Inline::none(), later, &alarms).ok();
        let here = task_of(&alarms);
        let other = std::thread::scope(|s| {
            s.spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime");
                runtime.block_on(async {
                    let parked = Parked::park(Inline::none(), later, &alarms).ok();
                    (task_of(&alarms), parked)
                })
            })
            .join()
            .expect("the thread ends")
        });
        assert!(
            !Arc::ptr_eq(&here, &other.0),
            "another runtime, another task"
        );
        // The first task was told that no more registrations come.
        assert!(locked(&here.heap).closed);
        // The other runtime is gone, and its task with it: the next hold
        // here starts a task on this runtime again.
        assert!(other.0.ended.load(Ordering::Acquire));
        let again = Parked::park(Inline::none(), later, &alarms).ok();
        assert!(!Arc::ptr_eq(&task_of(&alarms), &other.0));
        drop((first, other.1, again));
    }
}
