//! Credit-based flow control, a rule of the general layer.
//!
//! RDS leaves the flow control of a connection to its transport: TCP has
//! its own window, and an RDS-TCP connection uses no credits. A transport
//! whose sends would overrun the peer's posted receive buffers (InfiniBand
//! / RoCE: a SEND meeting an empty receive queue gets RNR NAKs) counts
//! them instead, as the kernel's `rds_ib_send_grab_credits`,
//! `rds_ib_send_add_credits` and `rds_ib_advertise_credits` do. The rule
//! lives here, sans I/O, as the state of one connection ([`Credits`]); a
//! transport declares that it uses it with [`crate::TransportCaps::credits`]
//! (IB yes, TCP and loopback no) and feeds it from its completions and its
//! wire (rds-ib: the `h_credit` byte of every frame, the initial credits of
//! the connection setup, the receive buffers it reposts). How frames carry
//! acks, and work request accounting, stay in the transport.
//!
//! Two counters:
//!
//! * *send credits*: frames we may post without overrunning the peer's
//!   receive queue; one per frame (data fragment or ack-only frame);
//! * *posted credits*: receive buffers we posted and have not advertised to
//!   the peer yet. Every frame may carry up to [`MAX_ADV_CREDIT`] of them
//!   (the header's `h_credit` is a byte).
//!
//! Both peers running out of send credits while holding unadvertised posted
//! credits would deadlock, so the last send credit is only spent on a frame
//! that also advertises credits: when posted credits are 0, one send credit
//! is held back. Posting [`CREDIT_UPDATE_THRESHOLD`] or more unadvertised
//! buffers requests an explicit credit update. When a grab comes up short
//! the connection is "send full" and stops pulling; credits arriving clear
//! it and the transport pulls again. Each counter is bounded by
//! [`MAX_CREDITS`], as the kernel keeps both in 16 bits of one atomic.
//!
//! Flow control is negotiated at connection setup: our sends are limited
//! only when this side enables it and the peer advertised a non-zero
//! initial credit (`rds_ib_set_flow_control`). Mainline kernels have it off
//! (the `flow_control` sysctl is 0, and their initial advertisement is
//! taken before any receive is posted, so it is 0 anyway); then every grab
//! succeeds, nothing is advertised and the peer relies on RNR retry. Having
//! advertised non-zero initial credits, we keep granting credits even when
//! the answer turns our own limiting off ([`Credits`] explains why).

/// Most credits one header advertises (`RDS_MAX_ADV_CREDIT`, `h_credit` is a byte).
pub const MAX_ADV_CREDIT: u32 = 255;
/// Unadvertised posted credits that request an explicit credit update.
pub const CREDIT_UPDATE_THRESHOLD: u32 = 16;
/// The kernel keeps each counter in 16 bits of one atomic.
pub const MAX_CREDITS: u32 = 0xffff;

/// What a grab obtained.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CreditGrant {
    /// Send credits obtained (frames that may be posted).
    pub got: u32,
    /// Posted credits taken for advertisement in the frame(s) being posted.
    pub advertise: u32,
}

/// The credit counters of one connection.
///
/// The kernel has one flag (`i_flowctl`) for both directions. Here the two
/// uses are kept apart: *limiting* (our sends need send credits) and
/// *advertising* (we count posted receives and grant them in `h_credit`).
/// They differ in one case only: we sent non-zero initial credits in our
/// connect request and the accept came back with 0. The peer may then have
/// turned flow control on (a kernel passive side does when its sysctl is on,
/// yet always answers 0 because its receive ring is filled only later), and
/// it would stall for ever if we stopped granting credits; so we keep
/// advertising while our own sends stay unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Credits {
    limiting: bool,
    advertising: bool,
    initial_advertised: bool,
    send: u32,
    posted: u32,
    send_full: bool,
}

impl Credits {
    /// Counters of a new connection attempt; `flowctl` is whether this side
    /// advertises flow control in its connect request (the active side's
    /// `i_flowctl = flow_control` sysctl; a passive side starts with false and
    /// calls [`Credits::set_flow_control`] with the request's credits).
    pub fn new(flowctl: bool) -> Credits {
        Credits { limiting: flowctl, advertising: flowctl, ..Credits::default() }
    }

    /// Our sends are limited by send credits.
    pub fn flow_control(&self) -> bool {
        self.limiting
    }

    /// We count posted receives and grant them to the peer.
    pub fn advertising(&self) -> bool {
        self.advertising
    }

    pub fn send_credits(&self) -> u32 {
        self.send
    }

    pub fn posted_credits(&self) -> u32 {
        self.posted
    }

    /// A grab came up short and no credits arrived since.
    pub fn send_full(&self) -> bool {
        self.send_full
    }

    /// The negotiation (`rds_ib_set_flow_control`): our sends are limited
    /// only if flow control is `enabled` locally and the peer's connection
    /// setup (IB: its CM private data or side channel parameters)
    /// advertised `peer_credits` > 0, which become our send credits. We
    /// advertise when limited, and also after having sent non-zero initial
    /// credits ourselves (see the type's docs). Returns whether our sends
    /// are limited.
    pub fn set_flow_control(&mut self, enabled: bool, peer_credits: u32) -> bool {
        self.limiting = enabled && peer_credits != 0;
        self.advertising = self.limiting || self.initial_advertised;
        if self.limiting {
            self.add_send_credits(peer_credits);
        }
        self.limiting
    }

    /// The credits to put in our connection setup (IB: our private data,
    /// `rds_ib_cm_fill_conn_param`): all posted credits when flow control
    /// is (being) advertised, 0 otherwise. They count as advertised.
    pub fn take_initial_advertisement(&mut self) -> u32 {
        if !self.advertising {
            return 0;
        }
        let n = std::mem::take(&mut self.posted);
        self.initial_advertised |= n != 0;
        n
    }

    /// `rds_ib_send_grab_credits`: up to `wanted` send credits, keeping the
    /// last one back unless posted credits go with it, and up to
    /// `max_posted` posted credits to advertise when something is sent (or
    /// always with `need_posted`). Without limiting, all of `wanted`. A
    /// short grab marks the connection send full.
    pub fn grab(&mut self, wanted: u32, need_posted: bool, max_posted: u32) -> CreditGrant {
        let got = if self.limiting {
            let mut avail = self.send;
            if avail > 0 && self.posted == 0 {
                avail -= 1;
            }
            let got = if avail < wanted {
                self.send_full = true;
                avail
            } else {
                wanted
            };
            self.send -= got;
            got
        } else {
            wanted
        };
        let mut advertise = 0;
        if self.advertising && self.posted > 0 && (got > 0 || need_posted) {
            advertise = self.posted.min(max_posted);
            self.posted -= advertise;
        }
        CreditGrant { got, advertise }
    }

    /// `rds_ib_send_add_credits`: credits granted by the peer (`h_credit` of a
    /// received frame) or unused credits given back. Returns true when the
    /// connection was send full, i.e. the transport should pull again.
    pub fn add_send_credits(&mut self, credits: u32) -> bool {
        if credits == 0 {
            return false;
        }
        self.send = self.send.saturating_add(credits).min(MAX_CREDITS);
        std::mem::take(&mut self.send_full)
    }

    /// `rds_ib_advertise_credits`: `posted` receive buffers were (re)posted.
    /// Returns true when a credit update should be sent now (16 or more
    /// credits wait for advertisement). Nothing is counted without flow
    /// control.
    pub fn advertise(&mut self, posted: u32) -> bool {
        if !self.advertising || posted == 0 {
            return false;
        }
        self.posted = self.posted.saturating_add(posted).min(MAX_CREDITS);
        self.posted >= CREDIT_UPDATE_THRESHOLD
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TransportCaps;

    #[test]
    fn only_ib_declares_credit_flow_control() {
        assert!(TransportCaps::ib().credits);
        assert!(!TransportCaps::tcp().credits);
        assert!(!TransportCaps::loopback().credits);
    }

    #[test]
    fn no_flow_control_grants_everything() {
        let mut c = Credits::new(false);
        assert_eq!(c.grab(1000, true, 255), CreditGrant { got: 1000, advertise: 0 });
        assert!(!c.advertise(100));
        assert_eq!(c.posted_credits(), 0);
        assert_eq!(c.take_initial_advertisement(), 0);
        // A peer advertising 0 turns it off even if we wanted it.
        let mut c = Credits::new(true);
        assert!(!c.set_flow_control(true, 0));
        assert!(!c.flow_control());
        // And so does our own setting.
        assert!(!Credits::new(false).set_flow_control(false, 64));
    }

    #[test]
    fn the_last_credit_is_kept_for_a_credit_update() {
        let mut c = Credits::new(false);
        assert!(c.set_flow_control(true, 3));
        assert_eq!(c.send_credits(), 3);
        // Nothing posted: one credit is held back.
        assert_eq!(c.grab(5, false, 255), CreditGrant { got: 2, advertise: 0 });
        assert!(c.send_full());
        assert_eq!(c.grab(1, false, 255), CreditGrant { got: 0, advertise: 0 });
        assert_eq!(c.send_credits(), 1);
        // With posted credits to advertise the last one may go.
        assert!(!c.advertise(4));
        assert_eq!(c.grab(1, false, 255), CreditGrant { got: 1, advertise: 4 });
        assert_eq!((c.send_credits(), c.posted_credits()), (0, 0));
        // Credits arriving clear "send full" and say so once.
        assert!(c.add_send_credits(10));
        assert!(!c.add_send_credits(1));
        assert!(!c.send_full());
    }

    #[test]
    fn advertisement_is_capped_and_need_posted_takes_without_sending() {
        let mut c = Credits::new(true);
        assert!(c.advertise(300));
        assert_eq!(c.take_initial_advertisement(), 300);
        assert!(c.set_flow_control(true, 10));
        assert!(!c.advertise(15));
        assert!(c.advertise(1), "16 pending request an update");
        c.advertise(300);
        assert_eq!(c.grab(2, false, MAX_ADV_CREDIT), CreditGrant { got: 2, advertise: 255 });
        assert_eq!(c.posted_credits(), 61);
        // wanted 0: nothing taken unless need_posted.
        assert_eq!(c.grab(0, false, 255), CreditGrant { got: 0, advertise: 0 });
        assert_eq!(c.grab(0, true, 50), CreditGrant { got: 0, advertise: 50 });
        assert_eq!(c.posted_credits(), 11);
        // Counters saturate at 16 bits.
        c.add_send_credits(u32::MAX);
        assert_eq!(c.send_credits(), MAX_CREDITS);
    }

    #[test]
    fn initial_credits_sent_keep_us_advertising() {
        // We (active) advertised 40; the accept says 0 (a kernel passive side
        // with flow control on answers 0 but limits its sends by our 40).
        let mut c = Credits::new(true);
        c.advertise(40);
        assert_eq!(c.take_initial_advertisement(), 40);
        assert!(!c.set_flow_control(true, 0));
        assert!(c.advertising());
        // Our sends are unlimited, but reposted receives are still granted.
        assert!(!c.advertise(10));
        assert_eq!(c.grab(500, false, 255), CreditGrant { got: 500, advertise: 10 });
        assert!(c.advertise(16));
        assert_eq!(c.grab(0, true, 255), CreditGrant { got: 0, advertise: 16 });
        // Without an initial advertisement, 0 back turns both off.
        let mut c = Credits::new(true);
        assert_eq!(c.take_initial_advertisement(), 0);
        assert!(!c.set_flow_control(true, 0));
        assert!(!c.advertising());
        assert!(!c.advertise(100));
        // The passive side decides before advertising: both or neither.
        let mut p = Credits::new(false);
        assert!(p.set_flow_control(true, 8));
        assert!(p.advertising());
        let mut p = Credits::new(false);
        assert!(!p.set_flow_control(false, 8));
        assert!(!p.advertising());
    }
}
