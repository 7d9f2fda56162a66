//! Credit flow control and acks of an RDS-IB connection, sans I/O.
//!
//! **Credits** ([`Credits`], `rds_ib_send_grab_credits`,
//! `rds_ib_send_add_credits`, `rds_ib_advertise_credits`): the rule is the
//! general layer's, [`rds_core::credits`] (what send and posted credits
//! are, the last send credit kept for a frame that advertises, at most
//! [`MAX_ADV_CREDIT`] per header, [`CREDIT_UPDATE_THRESHOLD`], the 16-bit
//! bounds, the negotiation). The IB transport declares it uses it
//! ([`rds_core::TransportCaps::credits`]) and feeds it here: the `h_credit`
//! byte of every received frame, the initial credits of the private data
//! or the side channel's parameters, the receive buffers it reposts; what
//! a grab yields becomes the `h_credit` of the frames it posts. Received
//! credits while "send full" make the transport pull again.
//!
//! **Acks** ([`AckState`], `rds_ib_set_ack`, `rds_ib_attempt_ack`,
//! `rds_ib_piggyb_ack`, `rds_ib_ack_send_complete`). Every frame carries
//! `h_ack`, the sequence of the last complete message received (congestion
//! maps excluded). An explicit ack is *requested* when a complete message
//! had ACK_REQUIRED (the core's pacing, [`rds_core::TxMessage::ack_required`])
//! or when a credit update is due; a data frame posted meanwhile
//! piggybacks it and clears the request, otherwise an ack-only frame is sent
//! (it needs a send credit like any frame). Only one ack-only frame is in
//! flight at a time; a request made meanwhile is served when its send
//! completes. A received `h_ack` above the last one seen acks everything up
//! to it ([`rds_core::TransportSink::acked`]).
//!
//! [`FlowControl`] combines both the way `rds_ib_xmit` and the receive
//! completion handler use them.
//!
//! **Receive flow control** ([`RxGate`], [`rds_core::RdsTransport::rx_flow`]).
//! While the core has a path paused, a receive buffer that completes is
//! reassembled (its bytes are copied out, the message is held, never
//! dropped) but not reposted, and so not granted to the peer again. The
//! posted ring drains: with credit flow control the peer runs out of send
//! credits once it used the ones it had (at most the ring, [`RxGate`]'s
//! test shows it); without (a mainline kernel advertises 0 credits) its
//! next send meets an empty receive queue and gets RNR NAKs, which it
//! retries without end (`rnr_retry_count` 7 in both directions), so its
//! QP neither fails nor drops anything. Either way what a paused
//! connection holds is at most one receive ring of fragments. The resume
//! reposts the held buffers in one go and grants them.

pub use rds_core::credits::{CREDIT_UPDATE_THRESHOLD, CreditGrant, Credits, MAX_ADV_CREDIT, MAX_CREDITS};

/// Ack state of one connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AckState {
    next: u64,
    requested: bool,
    in_flight: bool,
    recv: u64,
}

/// An ack-only frame to post: its `h_ack` and `h_credit`
/// ([`crate::proto::frag::ack_only_header`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AckOnly {
    pub ack: u64,
    pub credit: u8,
}

impl AckState {
    pub fn new() -> AckState {
        AckState::default()
    }

    /// A complete message arrived (`rds_ib_process_recv` + `rds_ib_set_ack`):
    /// its sequence becomes the ack to send unless it is a congestion map,
    /// and ACK_REQUIRED requests an explicit ack.
    pub fn on_message(&mut self, seq: u64, h_flags: u8) {
        if h_flags != rds_core::wire::flags::CONG_BITMAP {
            self.next = seq;
        }
        if h_flags & rds_core::wire::flags::ACK_REQUIRED != 0 {
            self.requested = true;
        }
    }

    /// Request an explicit ack (credit update due).
    pub fn request(&mut self) {
        self.requested = true;
    }

    pub fn requested(&self) -> bool {
        self.requested
    }

    /// An ack-only frame is posted and not completed.
    pub fn in_flight(&self) -> bool {
        self.in_flight
    }

    /// The ack we would send now.
    pub fn current(&self) -> u64 {
        self.next
    }

    /// The highest `h_ack` received so far.
    pub fn peer_acked(&self) -> u64 {
        self.recv
    }

    /// The `h_ack` of a received frame; returns the sequence to report as
    /// acked when it advances.
    pub fn on_peer_ack(&mut self, h_ack: u64) -> Option<u64> {
        if h_ack > self.recv {
            self.recv = h_ack;
            Some(h_ack)
        } else {
            None
        }
    }

    /// The ack a data frame piggybacks (`rds_ib_piggyb_ack`); clears a
    /// pending request. Returns the ack and whether a request was served.
    pub fn piggyback(&mut self) -> (u64, bool) {
        (self.next, std::mem::take(&mut self.requested))
    }

    /// `rds_ib_attempt_ack`: an ack-only frame if one is requested, none is
    /// in flight and a send credit is available (taking posted credits to
    /// advertise with it).
    pub fn attempt(&mut self, credits: &mut Credits, counters: &mut FlowCounters) -> Option<AckOnly> {
        if !self.requested {
            return None;
        }
        if self.in_flight {
            counters.ack_send_delayed += 1;
            return None;
        }
        let g = credits.grab(1, false, MAX_ADV_CREDIT);
        if g.got == 0 {
            counters.tx_throttle += 1;
            // Posted credits are only taken with a send credit.
            debug_assert_eq!(g.advertise, 0);
            return None;
        }
        self.requested = false;
        self.in_flight = true;
        counters.ack_sent += 1;
        if g.advertise > 0 {
            counters.tx_credit_updates += 1;
        }
        Some(AckOnly { ack: self.next, credit: g.advertise as u8 })
    }

    /// The ack-only frame's send completed: another may go.
    pub fn send_complete(&mut self) {
        self.in_flight = false;
    }

    /// Posting the ack-only frame failed: it is requested again.
    pub fn send_failed(&mut self) {
        self.in_flight = false;
        self.requested = true;
    }
}

/// Flow control counters under the kernel's names (`ib_*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowCounters {
    /// `ib_tx_throttle`: a send or ack found no credit.
    pub tx_throttle: u64,
    /// `ib_tx_credit_updates`: frames that advertised credits.
    pub tx_credit_updates: u64,
    /// `ib_rx_credit_updates`: received frames that granted credits.
    pub rx_credit_updates: u64,
    /// `ib_ack_sent`: ack-only frames posted.
    pub ack_sent: u64,
    /// `ib_ack_send_delayed`: an ack was due while one was in flight.
    pub ack_send_delayed: u64,
    /// `ib_ack_send_piggybacked`: a requested ack went out on a data frame.
    pub ack_send_piggybacked: u64,
}

impl FlowCounters {
    /// What grew since `earlier` (a snapshot of the same counters).
    pub fn since(&self, earlier: &FlowCounters) -> FlowCounters {
        FlowCounters {
            tx_throttle: self.tx_throttle.saturating_sub(earlier.tx_throttle),
            tx_credit_updates: self.tx_credit_updates.saturating_sub(earlier.tx_credit_updates),
            rx_credit_updates: self.rx_credit_updates.saturating_sub(earlier.rx_credit_updates),
            ack_sent: self.ack_sent.saturating_sub(earlier.ack_sent),
            ack_send_delayed: self.ack_send_delayed.saturating_sub(earlier.ack_send_delayed),
            ack_send_piggybacked: self.ack_send_piggybacked.saturating_sub(earlier.ack_send_piggybacked),
        }
    }

    pub fn add(&mut self, more: &FlowCounters) {
        self.tx_throttle += more.tx_throttle;
        self.tx_credit_updates += more.tx_credit_updates;
        self.rx_credit_updates += more.rx_credit_updates;
        self.ack_sent += more.ack_sent;
        self.ack_send_delayed += more.ack_send_delayed;
        self.ack_send_piggybacked += more.ack_send_piggybacked;
    }

    /// The counters with the kernel's names.
    pub fn named(&self) -> [(&'static str, u64); 6] {
        [
            ("ib_tx_throttle", self.tx_throttle),
            ("ib_tx_credit_updates", self.tx_credit_updates),
            ("ib_rx_credit_updates", self.rx_credit_updates),
            ("ib_ack_sent", self.ack_sent),
            ("ib_ack_send_delayed", self.ack_send_delayed),
            ("ib_ack_send_piggybacked", self.ack_send_piggybacked),
        ]
    }
}

/// A batch of data frames the sender may post now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataBatch {
    /// Frames (send credits) obtained; at most the number wanted.
    pub frames: u32,
    /// Credits to advertise in the batch's first frame.
    pub adv_credits: u8,
    /// The `h_ack` of the batch's frames.
    pub ack: u64,
}

/// Credits and acks of one connection, used as `rds_ib_xmit` and the receive
/// completion handler use them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowControl {
    pub credits: Credits,
    pub acks: AckState,
    pub counters: FlowCounters,
}

impl FlowControl {
    /// See [`Credits::new`].
    pub fn new(flowctl: bool) -> FlowControl {
        FlowControl { credits: Credits::new(flowctl), ..FlowControl::default() }
    }

    /// Credits for the next `wanted` fragments of a message. `first` is
    /// whether this is the message's first batch: then the ack is
    /// piggybacked (serving a pending request), and since no ack-only frame
    /// will carry the pending credits now, all of them that fit are taken
    /// for this batch too. Later batches carry the current ack. `None` when
    /// no frame may be posted (the connection is send full).
    pub fn data_batch(&mut self, wanted: u32, first: bool) -> Option<DataBatch> {
        let g = self.credits.grab(wanted, false, MAX_ADV_CREDIT);
        if g.got == 0 {
            if self.credits.flow_control() {
                self.counters.tx_throttle += 1;
            }
            return None;
        }
        let mut adv = g.advertise;
        let ack = if first {
            let (ack, served) = self.acks.piggyback();
            if served {
                self.counters.ack_send_piggybacked += 1;
            }
            if self.credits.advertising() {
                adv += self.credits.grab(0, true, MAX_ADV_CREDIT - adv).advertise;
            }
            ack
        } else {
            self.acks.current()
        };
        if adv > 0 {
            self.counters.tx_credit_updates += 1;
        }
        Some(DataBatch { frames: g.got, adv_credits: adv as u8, ack })
    }

    /// Credits of a batch that were not used (the message had fewer frames
    /// left, or posting failed) go back. Returns true when the transport
    /// should pull again.
    pub fn give_back(&mut self, frames: u32) -> bool {
        if !self.credits.flow_control() {
            return false;
        }
        self.credits.add_send_credits(frames)
    }

    /// A valid frame arrived with `h_ack` and `h_credit`. Returns the
    /// sequence to report acked (if it advanced) and whether the transport
    /// should pull again (credits arrived while send full).
    pub fn on_frame(&mut self, h_ack: u64, h_credit: u8) -> (Option<u64>, bool) {
        let mut kick = false;
        if h_credit != 0 {
            self.counters.rx_credit_updates += 1;
            kick = self.credits.add_send_credits(u32::from(h_credit));
        }
        (self.acks.on_peer_ack(h_ack), kick)
    }

    /// `posted` receive buffers were (re)posted; requests a credit update
    /// when enough wait for advertisement.
    pub fn on_refill(&mut self, posted: u32) {
        if self.credits.advertise(posted) {
            self.acks.request();
        }
    }

    /// An ack-only frame to post now, if one is due and possible.
    pub fn attempt_ack(&mut self) -> Option<AckOnly> {
        self.acks.attempt(&mut self.credits, &mut self.counters)
    }
}

/// Receive flow control of one connection (see the module docs): which
/// completed receive buffers wait for a resume instead of being reposted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RxGate {
    paused: bool,
    /// Buffers that completed while paused, in completion order.
    held: Vec<usize>,
    /// Times the gate closed.
    pub pauses: u64,
    /// Most buffers held at once.
    pub peak: usize,
}

impl RxGate {
    /// Whether completed buffers are held rather than reposted.
    pub fn paused(&self) -> bool {
        self.paused
    }

    /// Buffers held now.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Closes (`paused`) or opens the gate. Opening returns the held
    /// buffers, to be reposted (and granted) now, in completion order.
    pub fn set(&mut self, paused: bool) -> Vec<usize> {
        if paused && !self.paused {
            self.pauses += 1;
        }
        self.paused = paused;
        if paused { Vec::new() } else { std::mem::take(&mut self.held) }
    }

    /// Receive buffer `buf` completed and its contents were taken: true
    /// when it is to be reposted now, false when the gate holds it.
    pub fn completed(&mut self, buf: usize) -> bool {
        if !self.paused {
            return true;
        }
        self.held.push(buf);
        self.peak = self.peak.max(self.held.len());
        false
    }
}

#[cfg(test)]
mod tests;
