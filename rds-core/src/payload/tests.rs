//! The pool's rules: reuse, bounds, classes, thread caches, lending.

use super::*;

#[test]
fn a_dropped_payload_buffer_is_reused_with_the_new_bytes() {
    let pool = PayloadPool::new(1 << 20, 16);
    let a = pool.copy_from(&[1u8; 100]);
    let ptr = a.as_ptr();
    drop(a);
    assert_eq!(pool.stats().buffers, 1);
    assert_eq!(pool.stats().bytes, 128);
    // A shorter payload of the same class gets the same buffer, with
    // exactly its bytes (nothing of the previous one).
    let b = pool.copy_from(&[2u8; 70]);
    assert_eq!(b.as_ptr(), ptr);
    assert_eq!(&*b, &[2u8; 70][..]);
    let s = pool.stats();
    assert_eq!((s.reused, s.allocated, s.returned, s.buffers, s.bytes), (1, 1, 1, 0, 0));
}

#[test]
fn a_buffer_comes_back_only_when_the_last_clone_drops() {
    let pool = PayloadPool::new(1 << 20, 16);
    let a = pool.copy_from(b"hello");
    let b = a.clone();
    assert!(a.same_buffer(&b));
    drop(a);
    assert_eq!(pool.stats().buffers, 0, "a clone still reads it");
    // A new payload must not get the buffer the clone still reads.
    let c = pool.copy_from(b"world");
    assert!(!c.same_buffer(&b));
    assert_eq!(&*b, b"hello");
    assert_eq!(&*c, b"world");
    drop(b);
    assert_eq!(pool.stats().buffers, 1);
    drop(c);
    assert_eq!(pool.stats().buffers, 2);
    assert_eq!(pool.stats().returned, 2);
}

#[test]
fn classes_are_kept_apart() {
    let pool = PayloadPool::new(1 << 20, 16);
    drop(pool.copy_from(&[0u8; 64]));
    drop(pool.copy_from(&[0u8; 65]));
    drop(pool.copy_from(&[0u8; 4096]));
    let s = pool.stats();
    assert_eq!((s.buffers, s.bytes), (3, 64 + 128 + 4096));
    // 1..=64 bytes take the 64-byte buffer, 4000 the 4 KiB one.
    let small = pool.copy_from(&[1u8; 1]);
    let big = pool.copy_from(&[2u8; 4000]);
    assert_eq!((small.len(), big.len()), (1, 4000));
    let s = pool.stats();
    assert_eq!((s.buffers, s.bytes, s.reused, s.allocated), (1, 128, 2, 3));
}

#[test]
fn the_pool_is_bounded_in_buffers_and_bytes() {
    let pool = PayloadPool::new(1 << 20, 4);
    let many: Vec<Payload> = (0..10u8).map(|i| pool.copy_from(&[i; 10])).collect();
    drop(many);
    let s = pool.stats();
    assert_eq!((s.buffers, s.returned, s.discarded), (4, 4, 6));

    let pool = PayloadPool::new(3 * 4096, 100);
    let many: Vec<Payload> = (0..5u8).map(|i| pool.copy_from(&[i; 4096])).collect();
    drop(many);
    let s = pool.stats();
    assert_eq!((s.buffers, s.bytes, s.discarded), (3, 3 * 4096, 2));
}

#[test]
fn empty_and_oversized_payloads_never_touch_the_pool() {
    let pool = PayloadPool::new(8 << 20, 16);
    let e = pool.copy_from(&[]);
    assert!(e.is_empty());
    assert_eq!(e, Payload::empty());
    let huge = pool.copy_from(&vec![7u8; MAX_MSG_SIZE + 1]);
    assert_eq!(huge.len(), MAX_MSG_SIZE + 1);
    drop((e, huge));
    let s = pool.stats();
    assert_eq!((s.buffers, s.reused, s.allocated), (0, 0, 0));
    // The largest message is pooled.
    drop(pool.copy_from(&vec![1u8; MAX_MSG_SIZE]));
    assert_eq!(pool.stats().bytes, MAX_MSG_SIZE);
}

#[test]
fn adopted_buffers_come_back_only_with_a_class_size() {
    let pool = PayloadPool::new(1 << 20, 16);
    let mut odd = vec![3u8; 65];
    odd.shrink_to_fit();
    assert_eq!(odd.capacity(), 65);
    let p = pool.adopt(odd);
    assert_eq!(&*p, &[3u8; 65][..]);
    drop(p);
    assert_eq!(pool.stats().buffers, 0, "65 bytes of capacity is no class: freed");
    let mut exact = Vec::with_capacity(256);
    exact.extend_from_slice(&[5u8; 200]);
    let p = pool.adopt(exact);
    assert_eq!(&*p, &[5u8; 200][..]);
    drop(p);
    let s = pool.stats();
    assert_eq!((s.buffers, s.bytes), (1, 256));
    assert_eq!(pool.adopt(Vec::new()), Payload::empty());
}

#[test]
fn a_buffer_filled_in_place_goes_round_without_allocating() {
    let pool = PayloadPool::new(1 << 20, 16);
    // The first round allocates the buffer and its shell.
    let mut v = pool.take_vec(100);
    assert_eq!((v.len(), v.capacity()), (0, 128));
    let ptr = v.as_ptr();
    v.extend_from_slice(&[1u8; 100]);
    let p = pool.adopt(v);
    assert_eq!(&*p, &[1u8; 100][..]);
    drop(p);
    let s = pool.stats();
    assert_eq!((s.buffers, s.shells, s.allocated), (1, 0, 1));
    // The next takes that buffer (its shell waits) and adopting the
    // filled buffer takes the shell: nothing allocated.
    let mut v = pool.take_vec(128);
    assert_eq!(v.as_ptr(), ptr);
    assert!(v.is_empty(), "a lent buffer is empty");
    assert_eq!(pool.stats().shells, 1);
    v.extend_from_slice(&[2u8; 128]);
    let p = pool.adopt(v);
    assert_eq!(pool.stats().shells, 0);
    assert_eq!(&*p, &[2u8; 128][..]);
    drop(p);
    let s = pool.stats();
    assert_eq!((s.buffers, s.shells, s.allocated, s.reused), (1, 0, 1, 1));
    // Sizes beyond a message are plain vectors.
    assert_eq!(pool.take_vec(MAX_MSG_SIZE + 1).capacity(), MAX_MSG_SIZE + 1);
    assert_eq!(pool.take_vec(0).capacity(), 0);
}

#[test]
fn payloads_dropped_on_other_threads_come_back_intact() {
    let pool = PayloadPool::new(1 << 20, 64);
    for round in 0..50u8 {
        let ps: Vec<Payload> = (0..8u8).map(|i| pool.copy_from(&[round ^ i; 200])).collect();
        let clones = ps.clone();
        let t = std::thread::spawn(move || {
            for (i, p) in clones.iter().enumerate() {
                assert!(p.iter().all(|b| *b == round ^ i as u8), "a reused buffer changed under a reader");
            }
            drop(clones);
        });
        drop(ps);
        t.join().unwrap();
    }
    let s = pool.stats();
    // Every buffer came back or was freed, none twice: what the pool
    // holds is what came back minus what was reused.
    assert_eq!(s.reused + s.allocated, 400);
    assert!(s.returned + s.discarded <= 400, "{s:?}");
    assert_eq!(s.buffers as u64, s.returned - s.reused);
    assert!(s.buffers <= 8, "at most one round's buffers are free: {s:?}");
}

#[test]
fn a_thread_reuses_its_own_buffers_without_the_shared_lists() {
    // A thread of its own: this pool is the first with a thread cache
    // that the thread uses.
    std::thread::spawn(thread_reuses_its_own_buffers).join().unwrap();
}

fn thread_reuses_its_own_buffers() {
    let pool = PayloadPool::with_thread_cache(1 << 20, 16);
    let a = pool.copy_from(&[1u8; 64]);
    let ptr = a.as_ptr();
    drop(a);
    let b = pool.copy_from(&[2u8; 10]);
    assert_eq!(b.as_ptr(), ptr, "the thread's cache gave the buffer back");
    assert_eq!(&*b, &[2u8; 10][..]);
    let s = pool.stats();
    assert_eq!((s.allocated, s.reused, s.returned, s.buffers), (1, 0, 0, 0), "{s:?}");
    // A second pool with a cache is not cached on this thread.
    let other = PayloadPool::with_thread_cache(1 << 20, 16);
    drop(other.copy_from(b"x"));
    assert_eq!(other.stats().buffers, 1);
}

#[test]
fn a_full_thread_cache_spills_to_the_shared_lists_and_an_ending_thread_gives_all_back() {
    let pool = PayloadPool::with_thread_cache(8 << 20, 1000);
    let p = pool.clone();
    let n = THREAD_CACHE_BUFFERS + 10;
    std::thread::spawn(move || {
        let many: Vec<Payload> = (0..n).map(|i| p.copy_from(&[i as u8; 100])).collect();
        drop(many);
        let s = p.stats();
        // The cache held THREAD_CACHE_BUFFERS; the rest spilled in
        // batches (the overflowing buffer and up to BATCH - 1 more).
        assert!(s.buffers >= n - THREAD_CACHE_BUFFERS && s.buffers < n, "{s:?}");
    })
    .join()
    .unwrap();
    let s = pool.stats();
    assert_eq!((s.buffers, s.returned, s.discarded, s.allocated), (n, n as u64, 0, n as u64), "{s:?}");
    // Another thread takes them from the shared lists, a batch at a time.
    let p = pool.clone();
    std::thread::spawn(move || {
        let again: Vec<Payload> = (0..n).map(|i| p.copy_from(&[i as u8; 128])).collect();
        assert!(again.iter().enumerate().all(|(i, m)| m.len() == 128 && m.iter().all(|b| *b == i as u8)));
        let s = p.stats();
        assert_eq!((s.allocated, s.buffers), (n as u64, 0), "{s:?}");
        assert!(s.reused < n as u64, "batches, not a lock per payload: {s:?}");
    })
    .join()
    .unwrap();
}
