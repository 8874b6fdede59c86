package storage

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// Pool keeps a few disks of the default geometry made, attached and mounted
// ahead of time, so that creating a sandbox only renames an image file and
// moves a mount (a bind mount and an unmount, no I/O through the loop
// device) instead of waiting for the loop device's reads on a busy host.
//
// Ready disks live in Store.Dir()/pool: NAME.img mounted at NAME.mnt. They
// belong to no sandbox and are not in the ledger: a daemon that dies leaves
// them behind, and the next one's NewPool releases them before anything
// else runs. Take hands one over to a sandbox, whose ledger then holds it.
type Pool struct {
	store  *Store
	dir    string
	size   int64
	inodes int64
	target int
	log    *slog.Logger

	mu      sync.Mutex
	ready   []readyDisk
	filling bool
	closed  bool
	wg      sync.WaitGroup
}

type readyDisk struct{ image, mount string }

// NewPool releases what an earlier daemon's pool left in the store and
// returns a pool that keeps target disks of size bytes and inodes inodes
// ready. Call Fill to start making them.
func (s *Store) NewPool(size, inodes int64, target int, log *slog.Logger) (*Pool, error) {
	p := &Pool{store: s, dir: filepath.Join(s.dir, "pool"), size: size, inodes: inodes, target: target, log: log}
	if err := p.releaseLeftovers(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return nil, fmt.Errorf("storage: %w", err)
	}
	return p, nil
}

// releaseLeftovers unmounts, detaches and removes every disk in the pool
// directory.
func (p *Pool) releaseLeftovers() error {
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(p.dir))
	if err != nil {
		return fmt.Errorf("storage: read mount table: %w", err)
	}
	var errs []error
	for _, m := range mounts {
		if err := unix.Unmount(m.Mountpoint, unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("storage: unmount pool disk %s: %w", m.Mountpoint, err))
		}
	}
	imgs, _ := filepath.Glob(filepath.Join(p.dir, "*"+imageSuffix))
	for _, img := range imgs {
		errs = append(errs, Detach(img), RemoveImage(img))
	}
	if errors.Join(errs...) == nil {
		if err := os.RemoveAll(p.dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Matches reports whether the pool's disks have this geometry.
func (p *Pool) Matches(size, inodes int64) bool {
	return p != nil && p.target > 0 && size == p.size && inodes == p.inodes
}

// Take hands a ready disk over to a sandbox by renaming its image file to
// image (the loop device follows the file). It returns the path where the
// disk is mounted in the pool, for Mount, or "" when no disk is ready (the
// caller then makes one itself).
func (p *Pool) Take(image string) (string, error) {
	p.mu.Lock()
	if p.closed || len(p.ready) == 0 {
		p.mu.Unlock()
		p.Fill()
		return "", nil
	}
	d := p.ready[len(p.ready)-1]
	p.ready = p.ready[:len(p.ready)-1]
	p.mu.Unlock()
	p.Fill()
	if err := os.Rename(d.image, image); err != nil {
		p.release(d)
		return "", fmt.Errorf("storage: take ready disk: %w", err)
	}
	renameAttached(d.image, image)
	return d.mount, nil
}

// Mount moves a taken disk's file system from the pool to target (a
// directory it creates, 0700): a bind mount and the unmount of the pool's
// mount, neither of which does I/O on the device. Whatever happens, the
// pool's mount is gone afterwards; on error nothing is mounted at target
// and autoclear frees the device.
func (p *Pool) Mount(from, target string) error {
	err := os.Mkdir(target, 0o700)
	if err == nil {
		if err = unix.Mount(from, target, "", unix.MS_BIND, ""); err != nil {
			err = fmt.Errorf("storage: bind ready disk on %s: %w", target, err)
		}
	}
	if uerr := unix.Unmount(from, unix.UMOUNT_NOFOLLOW); uerr != nil {
		err = errors.Join(err, fmt.Errorf("storage: unmount pool disk: %w", uerr))
	}
	_ = os.Remove(from)
	return err
}

// Fill makes disks in the background until target are ready.
func (p *Pool) Fill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.filling || len(p.ready) >= p.target {
		return
	}
	p.filling = true
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			p.mu.Lock()
			if p.closed || len(p.ready) >= p.target {
				p.filling = false
				p.mu.Unlock()
				return
			}
			p.mu.Unlock()
			d, err := p.make()
			p.mu.Lock()
			if err != nil || p.closed {
				p.filling = false
				p.mu.Unlock()
				if err != nil {
					p.log.Warn("storage: cannot make a ready disk; sandboxes make their own", "err", err)
				} else {
					p.release(d)
				}
				return
			}
			p.ready = append(p.ready, d)
			p.mu.Unlock()
		}
	}()
}

// make creates, attaches and mounts one disk.
func (p *Pool) make() (d readyDisk, err error) {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return d, err
	}
	name := filepath.Join(p.dir, "disk-"+hex.EncodeToString(b[:]))
	d = readyDisk{image: name + imageSuffix, mount: name + ".mnt"}
	defer func() {
		if err != nil {
			p.release(d)
		}
	}()
	if err := p.store.CreateImage(context.Background(), d.image, p.size, p.inodes); err != nil {
		return d, err
	}
	dev, f, err := Attach(d.image)
	if err != nil {
		return d, err
	}
	defer f.Close()
	if err := os.Mkdir(d.mount, 0o700); err != nil {
		return d, fmt.Errorf("storage: %w", err)
	}
	return d, MountScratch(dev, d.mount)
}

func (p *Pool) release(d readyDisk) {
	if err := unix.Unmount(d.mount, unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		p.log.Warn("storage: unmount pool disk", "path", d.mount, "err", err)
	}
	_ = os.Remove(d.mount)
	if err := errors.Join(Detach(d.image), RemoveImage(d.image)); err != nil {
		p.log.Warn("storage: release pool disk", "image", d.image, "err", err)
	}
}

// Close stops filling and releases every ready disk.
func (p *Pool) Close() error {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.wg.Wait()
	p.mu.Lock()
	ready := p.ready
	p.ready = nil
	p.mu.Unlock()
	for _, d := range ready {
		p.release(d)
	}
	return p.releaseLeftovers()
}
