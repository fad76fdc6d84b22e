//! Parked holds: a granted hold whose machine has nothing to do before a
//! deadline (automatic renewal at a third of the TTL) stays with its guard,
//! whose calls run it inline as they run a hold that never renews, and an
//! alarm task of its [`Nodes`](crate::Nodes) ([`Alarms`]) wakes it at the
//! deadline by moving it to a task of its own. A hold released before its
//! first renewal (most short holds) therefore costs no task, no channel and
//! no hop between tasks for the release.
//!
//! The alarm task keeps the deadlines in a heap, each with a weak handle
//! to its hold: a hold that is gone by its deadline is skipped, and one
//! whose deadline moved later (a guard's `extend` ran it) is registered
//! again at its new deadline when the old one comes. A hold registers only
//! a deadline earlier than the one it already has in the heap, so it keeps
//! one or two entries there however often its guard calls; and a
//! registration wakes the task only when it comes before the deadline the
//! task sleeps until (holds of one TTL register in order, so it seldom
//! does).
//!
//! A hold's alarm runs on the runtime it was granted in, whichever runtime
//! its guard's calls come from (each runtime has an alarm task of its own),
//! and so does the task it moves to: when that runtime shuts down, the
//! holds it would have woken are not renewed, and their TTL ends them. A
//! guard dropped outside its grant runtime hands its driver back to it,
//! which releases the hold (best effort), as a hold's task does when its
//! guard's channel closes.

use crate::driver::{Call, Inline, OwnWork};
use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Holds woken in one go before the alarm task yields to the runtime (a
/// burst of deadlines, as when many holds were taken together, must not
/// keep a worker from the rest of its tasks).
const WAKES_PER_TURN: usize = 64;

/// The alarm tasks of a [`Nodes`](crate::Nodes), one per runtime its holds
/// were granted in, each started at the first parked hold of its runtime
/// (see the module docs).
#[derive(Default)]
pub(crate) struct Alarms(Mutex<Vec<AlarmTask>>);

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
    /// The task has ended (its runtime shut down, or it was closed).
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
    /// No registration comes any more (the `Nodes` and every parked hold
    /// are gone): the task forgets what is left and ends.
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
    /// Wake `parked` at `at`, on the alarm task of its grant runtime
    /// (started there if it has none, or its last one ended).
    fn set(&self, at: Instant, parked: &Arc<Parked>) {
        let id = parked.runtime.id();
        let shared = {
            let mut tasks = locked(&self.0);
            tasks.retain(|t| !t.shared.ended.load(Ordering::Acquire));
            match tasks.iter().find(|t| t.runtime == id) {
                Some(task) => Arc::clone(&task.shared),
                None => {
                    let shared = Arc::new(AlarmShared::default());
                    // On a runtime that has shut down the task is dropped
                    // at once, and the hold is not woken: its TTL ends it.
                    parked.runtime.spawn(alarm_task(Arc::clone(&shared)));
                    tasks.push(AlarmTask {
                        runtime: id,
                        shared: Arc::clone(&shared),
                    });
                    shared
                }
            }
        };
        shared.push(at, Arc::downgrade(parked));
    }
}

impl Drop for Alarms {
    fn drop(&mut self) {
        for task in locked(&self.0).drain(..) {
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
            if heap.closed {
                // Closed only once every parked hold is gone (each keeps
                // the `Alarms` alive): nothing is left to wake.
                return;
            }
            while heap.alarms.peek().is_some_and(|a| a.at <= now) {
                if let Some(alarm) = heap.alarms.pop() {
                    due.push(alarm.parked);
                }
            }
            let next = heap.alarms.peek().map(|a| a.at);
            heap.armed = next;
            next
        };
        for (n, parked) in due.drain(..).enumerate() {
            if let Some(parked) = parked.upgrade() {
                parked.wake(now);
            }
            if n % WAKES_PER_TURN == WAKES_PER_TURN - 1 {
                tokio::task::yield_now().await;
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
/// by the alarms that wake it.
pub(crate) struct Parked {
    state: Mutex<Slot>,
    alarms: Arc<Alarms>,
    /// The runtime the hold was granted in: its alarms run there, and a
    /// guard dropped outside any runtime gives its driver back there.
    runtime: Handle,
}

impl std::fmt::Debug for Parked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parked").finish_non_exhaustive()
    }
}

/// Where the driver is, and the earliest deadline registered for it.
struct Slot {
    state: State,
    /// The earliest of its deadlines in an alarm heap (`None` when none is
    /// known to be there): a later deadline is not registered, the alarm
    /// at this one registers it when it comes.
    alarm: Option<Instant>,
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
    /// there is no runtime to run its alarm on.
    pub(crate) fn park(
        inline: Inline,
        at: Instant,
        alarms: &Arc<Alarms>,
    ) -> Result<Arc<Parked>, Inline> {
        let Ok(runtime) = Handle::try_current() else {
            return Err(inline);
        };
        let parked = Arc::new(Parked {
            state: Mutex::new(Slot {
                state: State::Here(inline),
                alarm: Some(at),
            }),
            alarms: Arc::clone(alarms),
            runtime,
        });
        alarms.set(at, &parked);
        Ok(parked)
    }

    /// Take the driver for a guard's call.
    pub(crate) fn take(parked: &Arc<Parked>) -> Taken {
        let mut slot = locked(&parked.state);
        match std::mem::replace(&mut slot.state, State::Out) {
            State::Here(inline) => Taken::Here(Borrowed {
                parked: Arc::clone(parked),
                inline: Some(inline),
            }),
            State::Task(ops) => {
                slot.state = State::Task(ops.clone());
                Taken::Task(ops)
            }
            State::Out => Taken::Gone,
        }
    }

    /// An alarm at `now`: move the driver to a task if its deadline has
    /// come; if a guard's call moved the deadline later, register the new
    /// one.
    fn wake(self: &Arc<Parked>, now: Instant) {
        let mut slot = locked(&self.state);
        if slot.alarm.is_some_and(|at| at <= now) {
            slot.alarm = None;
        }
        let State::Here(inline) = &slot.state else {
            return;
        };
        match inline.own_work() {
            OwnWork::None => {}
            OwnWork::Deadline(at) if at > now => {
                if slot.alarm.is_none_or(|known| at < known) {
                    slot.alarm = Some(at);
                    drop(slot);
                    self.alarms.set(at, self);
                }
            }
            OwnWork::Deadline(_) | OwnWork::Requests => {
                if let State::Here(inline) = std::mem::replace(&mut slot.state, State::Out) {
                    slot.state = State::Task(inline.into_task());
                }
            }
        }
    }

    /// The driver is back from a guard's call: parked for its next
    /// deadline, kept for the next call, or moved to a task.
    fn put_back(self: &Arc<Parked>, inline: Inline) {
        let work = inline.own_work();
        let mut slot = locked(&self.state);
        match work {
            OwnWork::Deadline(at) => {
                // In place before the alarm is set, so that an alarm due
                // at once finds it.
                slot.state = State::Here(inline);
                if slot.alarm.is_none_or(|known| at < known) {
                    slot.alarm = Some(at);
                    drop(slot);
                    self.alarms.set(at, self);
                }
            }
            // A task runs on the grant runtime, wherever the call ran.
            OwnWork::Requests => slot.state = State::Task(self.to_task(inline)),
            OwnWork::None => slot.state = State::Here(inline),
        }
    }

    /// Move `inline` to a task on the grant runtime.
    fn to_task(&self, inline: Inline) -> mpsc::UnboundedSender<Call> {
        let _entered = self.runtime.enter();
        inline.into_task()
    }
}

impl Drop for Parked {
    /// The guard is gone (and no alarm is waking it). Inside the grant
    /// runtime the driver's own drop finishes its work (it releases the
    /// hold, best effort); elsewhere, the driver goes back to the grant
    /// runtime to be dropped there.
    fn drop(&mut self) {
        let slot = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        let State::Here(inline) = std::mem::replace(&mut slot.state, State::Out) else {
            return;
        };
        if Handle::try_current().is_ok_and(|h| h.id() == self.runtime.id()) {
            drop(inline);
        } else {
            // Outside the grant runtime (none, or another that may end
            // first). On a runtime that has shut down the future is
            // dropped here, and with no runtime the TTL ends the hold.
            self.runtime.spawn(async move { drop(inline) });
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

    /// The alarm task of the current runtime.
    fn task_here(alarms: &Alarms) -> Arc<AlarmShared> {
        let id = Handle::current().id();
        let tasks = locked(&alarms.0);
        let task = tasks.iter().find(|t| t.runtime == id);
        Arc::clone(&task.expect("an alarm task on this runtime").shared)
    }

    async fn ends(task: &AlarmShared) -> bool {
        for _ in 0..100 {
            if task.ended.load(Ordering::Acquire) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
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
            panic!("a hold parks inside a runtime");
        };
        let task = task_here(&alarms);
        // The nodes go; a parked hold is still there: the task stays.
        drop(alarms);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!task.ended.load(Ordering::Acquire), "it still has a hold");
        // The hold goes too, and with it the last of the alarms: the task
        // ends.
        drop(parked);
        assert!(ends(&task).await, "the alarm task did not end");
    }

    #[tokio::test]
    async fn a_hold_parks_on_its_grant_runtime_whatever_runtime_calls_next() {
        let alarms = Arc::new(Alarms::default());
        let later = Instant::now() + Duration::from_secs(3_600);
        let here = Parked::park(Inline::none(), later, &alarms).ok();
        let task = task_here(&alarms);
        // A hold granted in another runtime gets an alarm task there; the
        // task here goes on.
        let (other_task, other) = std::thread::scope(|s| {
            s.spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime");
                runtime.block_on(async {
                    let parked = Parked::park(Inline::none(), later, &alarms).ok();
                    (task_here(&alarms), parked)
                })
            })
            .join()
            .expect("the thread ends")
        });
        assert!(!Arc::ptr_eq(&task, &other_task), "a task per runtime");
        assert!(
            other_task.ended.load(Ordering::Acquire),
            "ended with its runtime"
        );
        assert!(!task.ended.load(Ordering::Acquire), "the one here goes on");
        // A later registration of the hold granted here goes to the task
        // here, from wherever it comes.
        let Some(here) = here else {
            panic!("parked");
        };
        std::thread::scope(|s| {
            s.spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime");
                runtime.block_on(async { alarms.set(later, &here) });
            });
        });
        assert_eq!(locked(&task.heap).alarms.len(), 2, "registered here again");
        drop((here, other));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_guard_dropped_outside_any_runtime_hands_its_driver_back() {
        let alarms = Arc::new(Alarms::default());
        let later = Instant::now() + Duration::from_secs(3_600);
        let parked = Parked::park(Inline::none(), later, &alarms).ok();
        // Dropped on a thread of no runtime: the drop is spawned on the
        // grant runtime, not lost, and does not panic.
        std::thread::spawn(move || drop(parked))
            .join()
            .expect("no panic");
        let task = task_here(&alarms);
        drop(alarms);
        assert!(ends(&task).await, "every hold is gone");
    }
}
