//! The membership state machine: its request flow, fencing against etcd's lease expiry
//! (a property over random answers, failures and delays), leadership and epochs.

use super::*;
use proptest::prelude::*;

const T: Timing = Timing { lease_ttl_ms: 3000, margin_ms: 200, interval_ms: 1000 };

fn started(now: u64) -> (Member, i64) {
    let mut m = Member::new("a", T);
    assert_eq!(m.poll_request(now), Some(Request::GrantLease));
    assert_eq!(m.poll_request(now), None, "one grant in flight");
    m.lease_granted(now, now, 7, 3);
    (m, 7)
}

#[test]
fn a_node_gets_a_lease_registers_campaigns_and_allocates_as_leader() {
    let (mut m, lease) = started(0);
    assert_eq!(m.poll_event(), Some(Event::Serving));
    assert_eq!(m.poll_request(0), Some(Request::Register { lease }));
    m.registered(lease);
    assert_eq!(m.poll_request(0), Some(Request::Campaign { lease }));
    m.campaigned(0, Some(41));
    assert_eq!(m.poll_event(), Some(Event::Leading(41)));
    assert_eq!(m.poll_request(0), Some(Request::Publish { lease }));
    m.published(0);
    assert_eq!(m.poll_request(0), Some(Request::Allocate { term: 41, epoch: 0 }));
    m.allocated(5, Some(1));
    assert_eq!(m.epoch(), 1);
    assert_eq!(m.poll_request(5), None);
    assert_eq!(m.poll_timeout(), Some(1000), "the next keep-alive at a third of the TTL");
    assert_eq!(m.poll_request(1000), Some(Request::KeepAlive { lease, sent_at: 1000 }));
    m.kept_alive(1001, lease, 1000, 3);
    assert_eq!(m.lease(), Some((lease, 3800)));
    assert_eq!(m.poll_request(1005), Some(Request::Publish { lease }), "estimates every interval");
    m.published(1006);
    assert_eq!(m.poll_request(1006), Some(Request::Allocate { term: 41, epoch: 1 }));
}

#[test]
fn a_follower_does_not_campaign_while_a_leader_is_known_and_does_after_it_is_gone() {
    let (mut m, lease) = started(0);
    m.registered(lease);
    m.leader_seen(0, Some(Leader { name: "b".into(), term: 3 }));
    assert_eq!(m.poll_request(0), Some(Request::Publish { lease }), "a follower publishes its estimates");
    m.published(0);
    assert_eq!(m.poll_request(0), None);
    m.leader_seen(10, None);
    assert_eq!(m.poll_request(10), Some(Request::Campaign { lease }));
    m.campaigned(11, None);
    assert_eq!(m.poll_request(11), None, "a lost campaign waits for the leader key to be read");
    m.leader_seen(11, Some(Leader { name: "c".into(), term: 9 }));
    assert!(!m.leading(11));
    m.leader_seen(12, None);
    assert_eq!(m.poll_request(12), Some(Request::Campaign { lease }));
}

#[test]
fn a_leader_that_lost_its_lease_does_not_lead_again_by_its_old_key() {
    let (mut m, lease) = started(0);
    m.registered(lease);
    assert_eq!(m.poll_request(0), Some(Request::Campaign { lease }));
    m.campaigned(0, Some(4));
    assert!(m.leading(0));
    // The lease runs out (keep-alives unanswered); a new one is granted, while the reads
    // of the keys still show the old leader key (etcd slow to answer).
    m.kept_alive(10, lease, 10, 0);
    assert!(!m.leading(10));
    assert_eq!(m.poll_request(200), Some(Request::GrantLease));
    m.lease_granted(210, 200, 8, 3);
    m.leader_seen(220, Some(Leader { name: "a".into(), term: 4 }));
    assert!(m.serving(220));
    assert!(!m.leading(220), "term 4 was won under lease 7, not 8: not this node's key");
    assert_eq!(m.poll_request(220), Some(Request::Register { lease: 8 }));
    m.registered(8);
    assert_eq!(m.poll_request(220), Some(Request::Publish { lease: 8 }), "no campaign while a key is seen");
    m.published(220);
    // The old key expires at etcd; the node campaigns under its new lease.
    m.leader_seen(300, None);
    assert_eq!(m.poll_request(300), Some(Request::Campaign { lease: 8 }));
    m.campaigned(301, Some(30));
    assert!(m.leading(301));
    // A restarted process sees a key named after it from its earlier life: not its own.
    let (mut fresh, lease) = started(0);
    fresh.registered(lease);
    fresh.leader_seen(0, Some(Leader { name: "a".into(), term: 30 }));
    assert!(!fresh.leading(0));
    assert_eq!(fresh.poll_request(0), Some(Request::Publish { lease }));
}

#[test]
fn without_keep_alive_answers_the_node_fences_itself_before_etcd_can_expire_the_lease() {
    let (mut m, lease) = started(0);
    m.registered(lease);
    m.campaigned(0, Some(2));
    while m.poll_event().is_some() {}
    // etcd unreachable: every keep-alive fails.
    let mut now = 0;
    while now < 5000 {
        if let Some(r) = m.poll_request(now) {
            m.etcd_failed(now, &r);
        }
        now += 50;
        assert_eq!(m.serving(now), now < 2800, "at {now}");
    }
    assert!(!m.leading(now));
    let events: Vec<_> = std::iter::from_fn(|| m.poll_event()).collect();
    assert_eq!(events, vec![Event::Fenced, Event::NotLeading]);
    assert_eq!(m.poll_request(now), Some(Request::GrantLease), "a new lease is asked for");
}

#[test]
fn a_keep_alive_answered_with_no_ttl_means_the_lease_is_gone() {
    let (mut m, _) = started(0);
    assert!(matches!(m.poll_request(1000), Some(Request::KeepAlive { .. })));
    m.kept_alive(1010, 7, 1000, 0);
    assert!(!m.serving(1010));
    assert_eq!(m.check_epoch(1010, 0), Err(EpochRefusal::Fenced));
}

#[test]
fn peer_requests_at_another_epoch_are_refused() {
    let (mut m, _) = started(0);
    m.epoch_seen(4);
    m.epoch_seen(3);
    assert_eq!(m.epoch(), 4, "epochs never go back");
    assert_eq!(m.check_epoch(1, 4), Ok(()));
    assert_eq!(m.check_epoch(1, 3), Err(EpochRefusal::Stale { sent: 3, current: 4 }));
    assert_eq!(m.check_epoch(1, 5), Err(EpochRefusal::Ahead { sent: 5, current: 4 }));
}

#[test]
fn a_lost_member_key_is_written_again() {
    let (mut m, lease) = started(0);
    m.registered(lease);
    m.members_seen(vec![]);
    assert_eq!(m.poll_request(1), Some(Request::Register { lease }));
}

/// What etcd does with the node's requests, in the test's time.
#[derive(Debug, Clone)]
enum Answer {
    /// Answered after `delay` ms (at most `delay`: the test delivers it then).
    Ok(u64),
    /// Failed after `delay` ms.
    Fail(u64),
    /// Never answered.
    Lost,
}

fn answer() -> impl Strategy<Value = Answer> {
    prop_oneof![
        4 => (0u64..1500).prop_map(Answer::Ok),
        2 => (0u64..3000).prop_map(Answer::Fail),
        1 => Just(Answer::Lost),
    ]
}

proptest! {
    /// Safety: whatever etcd answers, and however late, the node serves only while
    /// etcd cannot yet have expired its lease — counted from etcd's side: a lease lives
    /// `ttl` after etcd *received* the grant or the last keep-alive, which is no earlier
    /// than when it was sent.
    #[test]
    fn the_node_never_serves_after_the_lease_could_have_expired_at_etcd(
        answers in prop::collection::vec(answer(), 1..60),
        step in 10u64..400,
    ) {
        let mut m = Member::new("a", T);
        let mut pending: Vec<(u64, Request, Answer)> = Vec::new();
        let mut answers = answers.into_iter().cycle();
        // When etcd last received a request renewing each lease (its earliest is the send
        // time; the test's etcd receives it at once). Lease ids count up.
        let mut renewed_at: std::collections::HashMap<i64, u64> = Default::default();
        let mut next_id = 1i64;
        let mut now = 0u64;
        for _ in 0..400 {
            while let Some(r) = m.poll_request(now) {
                let a = answers.next().unwrap();
                if let Answer::Ok(_) = a {
                    match r {
                        Request::KeepAlive { lease, .. } => { renewed_at.insert(lease, now); }
                        Request::GrantLease => { renewed_at.insert(-next_id, now); next_id += 1; }
                        _ => {}
                    }
                }
                pending.push((now, r, a));
            }
            now += step;
            let mut i = 0;
            while i < pending.len() {
                let (sent, r, a) = pending[i].clone();
                let due = match a { Answer::Ok(d) | Answer::Fail(d) => sent + d <= now, Answer::Lost => false };
                if !due { i += 1; continue; }
                pending.remove(i);
                match (r, a) {
                    (Request::GrantLease, Answer::Ok(_)) => {
                        // The grant's id, recorded when it was sent (as a negative key).
                        let id = renewed_at.keys().filter(|k| **k < 0).map(|k| -k).find(|id| renewed_at[&-id] == sent && !renewed_at.contains_key(id)).expect("a granted lease");
                        renewed_at.insert(id, sent);
                        m.lease_granted(now, sent, id, 3)
                    }
                    (Request::KeepAlive { lease, sent_at }, Answer::Ok(_)) => m.kept_alive(now, lease, sent_at, 3),
                    (Request::Register { lease }, Answer::Ok(_)) => m.registered(lease),
                    (Request::Campaign { .. }, Answer::Ok(_)) => m.campaigned(now, Some(1)),
                    (Request::Allocate { .. }, Answer::Ok(_)) => m.allocated(now, None),
                    (Request::Publish { .. }, Answer::Ok(_)) => m.published(now),
                    (r, _) => m.etcd_failed(now, &r),
                }
            }
            if m.serving(now) {
                let (id, _) = m.lease().expect("serving without a lease");
                let renewed = renewed_at[&id];
                prop_assert!(now < renewed + 3000, "serving at {} after etcd could expire the lease at {}", now, renewed + 3000);
            }
            prop_assert!(!m.leading(now) || m.serving(now));
        }
    }
}
