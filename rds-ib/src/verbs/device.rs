//! Devices and the protection domain: the RDMA devices of the host, whether
//! one serves a local address, and [`Verbs`], the process-wide state that
//! keeps one PD per device context (librdmacm's), shared by every
//! connection on that device.

use std::ffi::CStr;
use std::io;
use std::net::IpAddr;
use std::os::raw::c_int;
use std::sync::{Arc, Mutex};

use rdma_sys as sys;

use super::cm::CmChannel;
use super::{errno, sockaddr_ip};

/// Names of the RDMA devices (`ibv_get_device_list`).
pub fn device_names() -> io::Result<Vec<String>> {
    let mut n: c_int = 0;
    // SAFETY: n is a valid out pointer; the list is freed below.
    let list = unsafe { sys::ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(errno());
    }
    let mut names = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: the list holds n valid device pointers.
        let dev = unsafe { *list.add(i) };
        // SAFETY: dev is a device of the list; its name is a C string it owns.
        let name = unsafe { CStr::from_ptr(sys::ibv_get_device_name(dev)) };
        names.push(name.to_string_lossy().into_owned());
    }
    // SAFETY: list came from ibv_get_device_list and is freed once.
    unsafe { sys::ibv_free_device_list(list) };
    Ok(names)
}

/// Whether an RDMA device serves the local address `addr`
/// (`rds_ib_laddr_check`: an RDMA CM id bound to it lands on a device).
pub fn addr_has_device(addr: IpAddr) -> io::Result<bool> {
    let ch = CmChannel::new()?;
    let guard = ch.create_id()?;
    let id = guard.0;
    let mut sa = sockaddr_ip(addr, 0);
    // SAFETY: id is live; sa is valid for the call.
    if unsafe { sys::rdma_bind_addr(id, &mut sa as *mut _ as *mut libc::sockaddr) } != 0 {
        return Ok(false);
    }
    // SAFETY: id is live; verbs is set when the address is on a device.
    Ok(!unsafe { (*id).verbs }.is_null())
}

struct Pd {
    ctx: *mut sys::ibv_context,
    pd: *mut sys::ibv_pd,
}

/// The process-wide verbs state: one protection domain per device context
/// (librdmacm's), shared by all connections.
pub struct Verbs {
    pds: Mutex<Vec<Pd>>,
    /// Device contexts opened by us (verbs-only mode): name and context.
    pub(super) opened: Mutex<Vec<(String, *mut sys::ibv_context)>>,
    /// QPs created so far (both modes).
    pub(super) qp_created: std::sync::atomic::AtomicU64,
    /// Credit flow control offered on new connections (both setups).
    flow_control: std::sync::atomic::AtomicBool,
}

// SAFETY: the PD and context pointers are library objects that verbs allow
// to be used from any thread; the list is behind a mutex.
unsafe impl Send for Verbs {}

// SAFETY: as above.
unsafe impl Sync for Verbs {}

impl Verbs {
    pub fn new() -> Arc<Verbs> {
        Arc::new(Verbs {
            pds: Mutex::new(Vec::new()),
            opened: Mutex::new(Vec::new()),
            qp_created: Default::default(),
            // On by default: the transport declares credit flow control
            // ([`rds_core::TransportCaps::credits`]).
            flow_control: std::sync::atomic::AtomicBool::new(crate::CAPS.credits),
        })
    }

    /// Whether new connections offer credit flow control (on by
    /// default; [`crate::proto::credits`]): our private data advertises the
    /// posted receive ring, and our sends are limited by credits when the
    /// peer advertised some too. A peer that advertises 0 (every mainline
    /// kernel) turns our limiting off; then RNR retry paces the sender.
    /// Verbs-only connections negotiate it the same way in the side
    /// channel's parameters (`credits`).
    pub fn set_flow_control(&self, on: bool) {
        self.flow_control.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn flow_control(&self) -> bool {
        self.flow_control.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The shared PD of a device context, allocated on first use.
    pub(super) fn pd_for(&self, ctx: *mut sys::ibv_context) -> io::Result<*mut sys::ibv_pd> {
        let mut pds = self.pds.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = pds.iter().find(|p| p.ctx == ctx) {
            return Ok(p.pd);
        }
        // SAFETY: ctx is a live device context taken from an rdma_cm_id.
        let pd = unsafe { sys::ibv_alloc_pd(ctx) };
        if pd.is_null() {
            return Err(errno());
        }
        pds.push(Pd { ctx, pd });
        Ok(pd)
    }

    /// QPs created so far, in both setup modes.
    pub fn qp_created(&self) -> u64 {
        self.qp_created.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Number of PDs allocated (one per device in use).
    pub fn pd_count(&self) -> usize {
        self.pds.lock().map(|p| p.len()).unwrap_or(0)
    }
}

impl Drop for Verbs {
    fn drop(&mut self) {
        let pds = self.pds.get_mut().unwrap_or_else(|p| p.into_inner());
        for p in pds.drain(..) {
            // SAFETY: every connection holding this PD (through an Arc) is gone.
            unsafe { sys::ibv_dealloc_pd(p.pd) };
        }
        let opened = self.opened.get_mut().unwrap_or_else(|p| p.into_inner());
        for (_, ctx) in opened.drain(..) {
            // SAFETY: opened by us; its PDs are gone.
            unsafe { sys::ibv_close_device(ctx) };
        }
    }
}
