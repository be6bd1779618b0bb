//! Who may attach to a stack interface, decided without ever waiting on the plane's thread
//! (which runs the stack's turns). The owner, root and the guests named by user id are
//! known at once. Membership of a guest group is the user and group databases' to say
//! (`getpwuid`, `getgrouplist`: through NSS, which may be LDAP or SSSD and take seconds): it
//! is asked on a thread of its own, and each answer kept for [`REMEMBERED`]. Meanwhile the
//! request waits, without holding the turn up; one not decided by its deadline is refused.

use super::settings::Attachers;
use std::collections::HashMap;
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long an answer of the databases is kept: a user added to a group is admitted within
/// this, one removed refused within this.
pub const REMEMBERED: Duration = Duration::from_secs(30);
/// Users waiting to be looked up; beyond, a new one is refused at once (a flood of users
/// the databases are slow on must not grow a queue).
const WAITING: usize = 64;
/// Answers kept at most; the oldest go first.
const KEPT: usize = 4096;

/// The decision on one user.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Admitted,
    Refused,
    /// Being looked up: ask again.
    Pending,
}

/// The question the look-up thread answers: whether a user is a member of a guest group.
pub type Lookup = Arc<dyn Fn(u32) -> bool + Send + Sync>;

pub struct Admission {
    attachers: Attachers,
    answers: Arc<Mutex<HashMap<u32, (bool, Instant)>>>,
    /// Users asked of the look-up thread and not answered yet.
    asked: Arc<Mutex<std::collections::HashSet<u32>>>,
    ask: Option<SyncSender<u32>>,
}

impl Admission {
    /// Group memberships looked up in the system's databases.
    pub fn new(attachers: Attachers) -> Admission {
        let guests = attachers.guests.clone();
        Admission::with_lookup(attachers, Arc::new(move |uid| guests.in_groups(uid)))
    }

    /// Group memberships answered by `lookup` (tests give a slow or a fixed one).
    pub fn with_lookup(attachers: Attachers, lookup: Lookup) -> Admission {
        let answers = Arc::new(Mutex::new(HashMap::new()));
        let asked = Arc::new(Mutex::new(std::collections::HashSet::new()));
        // No group named: nothing is ever looked up, and no thread is needed.
        let ask = (!attachers.guests.gids.is_empty()).then(|| {
            let (ask, questions) = sync_channel::<u32>(WAITING);
            let (answers, asked) = (answers.clone(), asked.clone());
            let started = std::thread::Builder::new()
                .name("ordo-admission".into())
                .spawn(move || {
                    for uid in questions {
                        let yes = lookup(uid);
                        let mut a = answers.lock().unwrap_or_else(|p| p.into_inner());
                        if a.len() >= KEPT {
                            if let Some(oldest) = a.iter().min_by_key(|(_, (_, at))| *at).map(|(u, _)| *u) {
                                a.remove(&oldest);
                            }
                        }
                        a.insert(uid, (yes, Instant::now()));
                        asked.lock().unwrap_or_else(|p| p.into_inner()).remove(&uid);
                    }
                });
            started.ok().map(|_| ask)
        });
        Admission {
            attachers,
            answers,
            asked,
            ask: ask.flatten(),
        }
    }

    /// Whether `uid` may attach, without waiting.
    pub fn decide(&self, uid: u32) -> Decision {
        if self.attachers.admit_known(uid) {
            return Decision::Admitted;
        }
        let Some(ask) = &self.ask else {
            return Decision::Refused;
        };
        if let Some((yes, at)) = self.answers.lock().unwrap_or_else(|p| p.into_inner()).get(&uid) {
            if at.elapsed() < REMEMBERED {
                return if *yes { Decision::Admitted } else { Decision::Refused };
            }
        }
        let mut asked = self.asked.lock().unwrap_or_else(|p| p.into_inner());
        if asked.contains(&uid) {
            return Decision::Pending;
        }
        match ask.try_send(uid) {
            Ok(()) => {
                asked.insert(uid);
                Decision::Pending
            }
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => Decision::Refused,
        }
    }

    /// Whether `uid` is a guest (admitted, and neither the owner nor root): guests have a
    /// share of the stack, not all of it.
    pub fn is_guest(&self, uid: u32) -> bool {
        uid != self.attachers.owner && uid != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inner::stack::Guests;

    fn attachers(uids: Vec<u32>, gids: Vec<u32>) -> Attachers {
        Attachers {
            owner: 1000,
            guests: Guests { uids, gids },
        }
    }

    /// A look-up that takes a second does not hold up the caller: the decision is pending
    /// at once, then given from the answer; the owner, root and named users are known at
    /// once; with no group named, anyone else is refused at once.
    #[test]
    fn slow_lookups_are_never_waited_for() {
        let admission = Admission::with_lookup(
            attachers(vec![2000], vec![50]),
            Arc::new(|uid| {
                std::thread::sleep(Duration::from_millis(500));
                uid == 3000
            }),
        );
        for uid in [1000, 0, 2000] {
            assert_eq!(admission.decide(uid), Decision::Admitted, "uid {uid}");
        }
        let asked = Instant::now();
        assert_eq!(admission.decide(3000), Decision::Pending);
        assert_eq!(admission.decide(4000), Decision::Pending);
        assert_eq!(admission.decide(3000), Decision::Pending, "asked once, still pending");
        assert!(
            asked.elapsed() < Duration::from_millis(100),
            "the caller waited {:?}",
            asked.elapsed()
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        while admission.decide(4000) == Decision::Pending && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(admission.decide(3000), Decision::Admitted);
        assert_eq!(admission.decide(4000), Decision::Refused);
        assert!(admission.is_guest(3000) && !admission.is_guest(1000) && !admission.is_guest(0));
        let no_groups = Admission::with_lookup(attachers(vec![], vec![]), Arc::new(|_| panic!("looked up")));
        assert_eq!(no_groups.decide(3000), Decision::Refused);
    }

    /// Users beyond the look-up queue are refused at once rather than queued.
    #[test]
    fn a_flood_of_users_to_look_up_is_bounded() {
        let admission = Admission::with_lookup(
            attachers(vec![], vec![50]),
            Arc::new(|_| {
                std::thread::sleep(Duration::from_secs(1));
                true
            }),
        );
        let decisions: Vec<Decision> = (10_000..10_000 + 2 * WAITING as u32)
            .map(|u| admission.decide(u))
            .collect();
        let refused = decisions.iter().filter(|d| **d == Decision::Refused).count();
        assert!(refused >= WAITING - 1, "only {refused} refused");
    }
}
