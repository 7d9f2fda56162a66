//! [`RdmaBuf`] / [`RdmaSeg`]: memory that RDMA may read and write, from the
//! `rds-rdmabuf` crate (see its docs for the contract), re-exported here so
//! that `rds_core::RdmaBuf`, `rds_core::RdmaSeg` and `rds_core::rdma_buf::*`
//! name it as before. It lives in a crate of its own because it is the one
//! place that owns memory a device may write, and needs `unsafe` for it:
//! rds-core forbids unsafe code.
//!
//! Its range error, [`OutOfRange`], is the kernel's EINVAL: it converts into
//! [`Errno::EINVAL`] (so `?` works where an [`Errno`] is returned) and
//! compares equal to it.

pub use rds_rdmabuf::*;

use crate::types::Errno;

impl From<OutOfRange> for Errno {
    fn from(_: OutOfRange) -> Errno {
        Errno::EINVAL
    }
}

impl PartialEq<Errno> for OutOfRange {
    fn eq(&self, o: &Errno) -> bool {
        Errno::from(*self) == *o
    }
}

impl PartialEq<OutOfRange> for Errno {
    fn eq(&self, o: &OutOfRange) -> bool {
        *self == Errno::from(*o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The range checks as rds-core's users see them: `Errno::EINVAL`.
    #[test]
    fn ranges_are_checked_as_errno() {
        let b = RdmaBuf::new(100);
        assert_eq!(b.seg(1, 100).unwrap_err(), Errno::EINVAL);
        assert_eq!(b.seg(usize::MAX, 2).unwrap_err(), Errno::EINVAL);
        assert_eq!(b.write_at(99, b"ab").map_err(Errno::from), Err(Errno::EINVAL));
        let mut out = [0u8; 2];
        assert_eq!(b.read_at(usize::MAX, &mut out).map_err(Errno::from), Err(Errno::EINVAL));
        assert_eq!(Errno::EINVAL, OutOfRange);
        assert_ne!(Errno::EFAULT, OutOfRange);
        let f = || -> Result<RdmaSeg, Errno> { Ok(b.seg(50, 51)?) };
        assert_eq!(f().unwrap_err(), Errno::EINVAL);
        assert_eq!(OutOfRange.to_string(), Errno::EINVAL.to_string());
        assert_eq!(format!("{OutOfRange:?}"), format!("{:?}", Errno::EINVAL));
        assert_eq!(RDMA_BUF_ALIGN, 4096);
    }
}
