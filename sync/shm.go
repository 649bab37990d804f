package sync

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/elastictrain/elastictrain/sync/internal/wire"
)

// Shared-memory lanes: between ranks on one host (a lane over a Unix
// socket, without TLS), the sender of a lane creates a sealed anonymous
// shared-memory file of shmSlots slots of ChunkBytes and passes its
// descriptor to the receiver (SCM_RIGHTS) right after the handshake. Frame
// headers still travel on the socket and are checked as usual, but the
// payload of chunk i lies in slot i mod shmSlots: the sender copies it
// there before writing the header, the receiver reduces or copies it from
// there after reading the header. Flow control needs no system call in the
// common case: the first page of the file holds a counter of consumed
// chunks (written by the receiver) and a waiting flag (set by a sender out
// of free slots, which then blocks on the socket's reverse direction until
// the receiver writes a wake-up byte). This halves the copies of the socket
// path and saves the acknowledgement write per chunk.
const shmSlots = 4

// shmHeader is the control page in front of the slots: consumed (uint64) at
// offset 0 and waiting (uint32) at offset 64, on separate cache lines.
const shmHeader = 4096

func shmConsumed(mem []byte) *uint64 { return (*uint64)(unsafe.Pointer(&mem[0])) }
func shmWaiting(mem []byte) *uint32  { return (*uint32)(unsafe.Pointer(&mem[64])) }

const shmOfferSize = 12

var shmMagic = [4]byte{'E', 'T', 'S', 'M'}

// negotiateShm runs the offer/answer exchange on every lane (of every
// group) that runs over a Unix socket and returns the mappings by group and
// lane (nil where not shared). The exchange happens on every Unix lane,
// whatever the Config, so both ends always agree on it; a side that does
// not want or cannot map shared memory declines. Offers are written on
// every lane before any is read, so the order of the groups cannot
// deadlock.
func negotiateShm(ctx context.Context, cfg Config, rc *ringConns) (tx, rx [numGroups][][]byte, err error) {
	for g := range numGroups {
		tx[g] = make([][]byte, len(rc.right[g]))
		rx[g] = make([][]byte, len(rc.left[g]))
	}
	want := cfg.SharedMemory && shmSupported
	slotBytes := cfg.chunkBytes()
	size := shmHeader + shmSlots*slotBytes
	defer func() {
		if err != nil {
			for g := range numGroups {
				for _, m := range append(tx[g], rx[g]...) {
					shmUnmap(m)
				}
			}
			tx, rx = [numGroups][][]byte{}, [numGroups][][]byte{}
		}
	}()
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(cfg.DialTimeout)
	}
	// 1. Offer on every lane this rank sends on.
	for g := range numGroups {
		for l, c := range rc.right[g] {
			uc, ok := c.(*net.UnixConn)
			if !ok {
				continue
			}
			uc.SetDeadline(deadline)
			var msg [shmOfferSize]byte
			copy(msg[:], shmMagic[:])
			var oob []byte
			if want {
				fd, mem, err := shmCreate(size)
				if err == nil {
					tx[g][l] = mem
					binary.LittleEndian.PutUint32(msg[4:], shmSlots)
					binary.LittleEndian.PutUint32(msg[8:], uint32(slotBytes))
					oob = syscall.UnixRights(fd)
					defer closeFD(fd)
				} else {
					cfg.logger().Debug("sync: no shared memory for lane", "lane", l, "err", err)
				}
			}
			if _, _, err := uc.WriteMsgUnix(msg[:], oob, nil); err != nil {
				return tx, rx, fmt.Errorf("%w: shared-memory offer on lane %d: %v", ErrPeerLost, l, err)
			}
		}
	}
	// 2. Answer every lane this rank receives on.
	for g := range numGroups {
		for l, c := range rc.left[g] {
			uc, ok := c.(*net.UnixConn)
			if !ok {
				continue
			}
			uc.SetDeadline(deadline)
			mem, err := readOffer(uc, size, want)
			if err != nil {
				return tx, rx, fmt.Errorf("shared-memory offer on lane %d: %w", l, err)
			}
			rx[g][l] = mem
			answer := []byte{0}
			if mem != nil {
				answer[0] = 1
			}
			if _, err := uc.Write(answer); err != nil {
				return tx, rx, fmt.Errorf("%w: shared-memory answer on lane %d: %v", ErrPeerLost, l, err)
			}
		}
	}
	// 3. Read the answers to this rank's offers.
	for g := range numGroups {
		for l, c := range rc.right[g] {
			uc, ok := c.(*net.UnixConn)
			if !ok {
				continue
			}
			var answer [1]byte
			if _, err := uc.Read(answer[:]); err != nil {
				return tx, rx, fmt.Errorf("%w: shared-memory answer on lane %d: %v", ErrPeerLost, l, err)
			}
			if answer[0] != 1 {
				shmUnmap(tx[g][l])
				tx[g][l] = nil
			}
		}
	}
	for g := range numGroups {
		for _, c := range append(rc.right[g], rc.left[g]...) {
			if c != nil {
				c.SetDeadline(time.Time{})
			}
		}
	}
	return tx, rx, nil
}

// readOffer reads exactly one offer (and its descriptor, if any) and maps
// it when wanted and valid.
func readOffer(uc *net.UnixConn, size int, want bool) ([]byte, error) {
	var msg [shmOfferSize]byte
	oob := make([]byte, syscall.CmsgSpace(4*4))
	got, fds := 0, []int(nil)
	for got < shmOfferSize {
		n, oobn, _, _, err := uc.ReadMsgUnix(msg[got:], oob)
		if err != nil {
			for _, fd := range fds {
				closeFD(fd)
			}
			return nil, fmt.Errorf("%w: %v", ErrPeerLost, err)
		}
		if oobn > 0 {
			if cms, err := syscall.ParseSocketControlMessage(oob[:oobn]); err == nil {
				for _, cm := range cms {
					if r, err := syscall.ParseUnixRights(&cm); err == nil {
						fds = append(fds, r...)
					}
				}
			}
		}
		got += n
	}
	defer func() {
		for _, fd := range fds {
			closeFD(fd)
		}
	}()
	if [4]byte(msg[:4]) != shmMagic {
		return nil, fmt.Errorf("%w: bad shared-memory offer", ErrBadFrame)
	}
	slots := binary.LittleEndian.Uint32(msg[4:])
	slotBytes := binary.LittleEndian.Uint32(msg[8:])
	if slots == 0 || !want || len(fds) != 1 {
		return nil, nil // declined (by the peer or by us)
	}
	if shmHeader+int(slots)*int(slotBytes) != size {
		return nil, fmt.Errorf("%w: shared memory of %d slots of %d bytes, this rank expects %d bytes (ChunkBytes differ?)", ErrMismatch, slots, slotBytes, size)
	}
	mem, err := shmMap(fds[0], size)
	if err != nil {
		return nil, nil // fall back to the socket
	}
	return mem, nil
}

// laneWrite sends one chunk of a lane: through shared memory when the lane
// has it, else header and payload on the socket.
func (r *Ring) laneWrite(l *lane, h *wire.Header, payload []byte, peer int) error {
	if l.tx == nil {
		return r.writeFrame(l.right, l.hdrW[:], h, payload, peer)
	}
	if err := r.shmWaitSlot(l, peer); err != nil {
		return err
	}
	r.shmPut(l, payload)
	return r.writeFrame(l.right, l.hdrW[:], h, nil, peer, len(payload))
}

// shmSlotFree tells whether lane l has a free slot: fewer than shmSlots
// chunks sent and not consumed.
func shmSlotFree(l *lane) bool {
	return l.txNext-atomic.LoadUint64(shmConsumed(l.tx)) < shmSlots
}

// shmWaitSlot waits until lane l has a free slot. The chunks it waits for
// must have had their headers sent.
func (r *Ring) shmWaitSlot(l *lane, peer int) error {
	consumed, waiting := shmConsumed(l.tx), shmWaiting(l.tx)
	for l.txNext-atomic.LoadUint64(consumed) >= shmSlots {
		atomic.StoreUint32(waiting, 1)
		if l.txNext-atomic.LoadUint64(consumed) < shmSlots {
			atomic.StoreUint32(waiting, 0)
			break
		}
		_, err := l.right.Read(l.wakeBuf[:]) // wake-up bytes (possibly stale ones)
		atomic.StoreUint32(waiting, 0)
		if err != nil {
			return r.connErr(peer, err)
		}
	}
	if c := atomic.LoadUint64(consumed); c > l.txNext {
		return r.protoErr(fmt.Errorf("%w: rank %d consumed %d shared-memory chunks of %d sent", ErrBadFrame, peer, c, l.txNext))
	}
	return nil
}

// shmPut copies payload into lane l's next slot, which must be free.
func (r *Ring) shmPut(l *lane, payload []byte) {
	off := shmHeader + int(l.txNext%shmSlots)*l.slotBytes
	copy(l.tx[off:off+l.slotBytes], payload)
	l.txNext++
}

// pairSendShm is the sending half of a two-rank exchange (algoPair) on a
// shared-memory lane: it copies every chunk of the lane's part into a slot
// and sends the chunks' headers together, in one write, as late as it can
// (before waiting for a slot, and at the end), so the other rank wakes up
// once for all of them rather than once per chunk.
func (r *Ring) pairSendShm(l *lane, j *laneJob, h *wire.Header, chunk, peer int) error {
	batch := l.hdrBatch[:0]
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		_, err := l.right.Write(batch)
		batch = batch[:0]
		if err != nil {
			return r.connErr(peer, err)
		}
		return nil
	}
	for k, c := 0, j.lo; c < j.hi; k, c = k+1, c+chunk {
		e := min(c+chunk, j.hi)
		var payload []byte
		if j.vec == nil {
			payload = j.buf[c*j.elem : e*j.elem]
		}
		if !shmSlotFree(l) {
			if err := flush(); err != nil {
				return err
			}
			if err := r.shmWaitSlot(l, peer); err != nil {
				return err
			}
		}
		n := (e - c) * j.elem
		if j.vec == nil {
			r.shmPut(l, payload)
		} else {
			slot := l.tx[shmHeader+int(l.txNext%shmSlots)*l.slotBytes:]
			j.vec.each(c*j.elem, e*j.elem, func(p []byte, off int) { copy(slot[off:], p) })
			l.txNext++
		}
		l.sendProg.Store(prog(0, k))
		notify(l.sendNote)
		// At most shmSlots headers wait unsent (each holds a slot the
		// other rank cannot free before reading it): hdrBatch's capacity.
		h.Length = uint32(n)
		hn := len(batch)
		batch = batch[:hn+wire.HeaderSize]
		h.Put(batch[hn:])
	}
	err := flush()
	l.hdrBatch = batch[:0]
	return err
}

// laneRecvInto receives the next chunk of a lane, of len(dst) bytes, and
// folds it into dst with red, or copies it when red is nil.
func (r *Ring) laneRecvInto(l *lane, h *wire.Header, dst []byte, red reduceFunc, peer int) error {
	if l.rx == nil {
		if red == nil {
			return r.readFrame(l.leftR, l.hdrR[:], h, dst, peer)
		}
		tmp := l.scratch[:len(dst)]
		if err := r.readFrame(l.leftR, l.hdrR[:], h, tmp, peer); err != nil {
			return err
		}
		red(dst, tmp)
		return nil
	}
	if err := r.readHeader(l.leftR, l.hdrR[:], h, len(dst), peer); err != nil {
		return err
	}
	off := shmHeader + int(l.rxNext%shmSlots)*l.slotBytes
	src := l.rx[off : off+len(dst)]
	if red == nil {
		copy(dst, src)
	} else {
		red(dst, src)
	}
	return r.shmConsume(l, peer)
}

// shmConsume frees the shared-memory slot of the chunk just received.
func (r *Ring) shmConsume(l *lane, peer int) error {
	l.rxNext++
	// Publish the free slot; wake the sender if it waits for one (the
	// sender sets waiting before re-reading consumed, so one of the two
	// sides always sees the other's write).
	atomic.AddUint64(shmConsumed(l.rx), 1)
	if atomic.LoadUint32(shmWaiting(l.rx)) != 0 {
		if _, err := l.left.Write(l.wake[:]); err != nil {
			return r.connErr(peer, err)
		}
	}
	return nil
}

// laneRecvPair receives the other rank's chunk for dst (len(dst) bytes)
// in a two-rank allreduce (algoPair) and, once sent returns (this rank's
// own chunk has left dst), sets dst to red(rank 0's chunk, rank 1's
// chunk): peerFirst tells whether the peer is rank 0. Both ranks run the
// same kernel on the same operands in the same order, so they end with the
// same bits (NaNs included). The chunk is read (into a shared-memory slot
// or the lane's scratch buffer) before the wait, so neither rank's sender
// can block on a receiver that waits for it.
func (r *Ring) laneRecvPair(l *lane, h *wire.Header, dst []byte, red reduceToFunc, peerFirst bool, peer int, sent func() error) error {
	var src []byte
	if l.rx == nil {
		src = l.scratch[:len(dst)]
		if err := r.readFrame(l.leftR, l.hdrR[:], h, src, peer); err != nil {
			return err
		}
	} else {
		if err := r.readHeader(l.leftR, l.hdrR[:], h, len(dst), peer); err != nil {
			return err
		}
		off := shmHeader + int(l.rxNext%shmSlots)*l.slotBytes
		src = l.rx[off : off+len(dst)]
	}
	if err := sent(); err != nil {
		return err
	}
	if peerFirst {
		red(dst, src, dst)
	} else {
		red(dst, dst, src)
	}
	if l.rx == nil {
		return nil
	}
	return r.shmConsume(l, peer)
}

// laneRecvPairVec is laneRecvPair for a job over tensors (j.vec, shared
// memory only): bytes [lo, hi) of their concatenation.
func (r *Ring) laneRecvPairVec(l *lane, h *wire.Header, j *laneJob, lo, hi int, peerFirst bool, peer int, sent func() error) error {
	if err := r.readHeader(l.leftR, l.hdrR[:], h, hi-lo, peer); err != nil {
		return err
	}
	off := shmHeader + int(l.rxNext%shmSlots)*l.slotBytes
	src := l.rx[off : off+hi-lo]
	if err := sent(); err != nil {
		return err
	}
	j.vec.each(lo, hi, func(p []byte, o int) {
		s := src[o : o+len(p)]
		if peerFirst {
			j.redTo(p, s, p)
		} else {
			j.redTo(p, p, s)
		}
		if j.div > 0 {
			j.scale(p, j.div)
		}
	})
	return r.shmConsume(l, peer)
}
