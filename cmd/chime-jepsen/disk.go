package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"
)

// Each node's data directory is, for the disk faults, an ext4 filesystem of its own: a
// sparse image file in the run's folder, attached to a loop device, made ext4 and mounted
// at the data directory before the node first starts. A loop device rather than tmpfs:
// tmpfs has no writeback and no fsync path, so it can neither fail an fsync nor stall one,
// while a full ext4 fails writes and fsyncs with ENOSPC as a production disk does, and a
// frozen one blocks them. (Device-mapper, whose dm-delay and dm-flakey would be the usual
// tools, is not in this kernel.)
//
// The filesystems are made only when --nemesis names a disk fault: the other faults then
// run on the disk they always ran on, so their runs stay comparable with earlier ones.

// diskImageSize is each node's filesystem. After a 2-minute run (--max-delay 20s, 30 s
// retention, 8 shards on 5 nodes, about 5 replicas a node) each node's data directory took
// 81 MiB (the driver logs it at the end of every run), most of it raft-wal's 16 MiB
// segments, allocated in full when made (one or two live per replica). A 10-minute mixed
// run with the default week of retention keeps every settled event too: about 150,000
// events, 3 copies over 5 nodes, a few hundred bytes each, some 50 MB more in Pebble, and a
// copy of a shard for each install or backup under way. 1 GiB leaves several times that,
// and filling it (disk-full) is a fallocate, not a write of the whole size. The image is
// sparse: it takes on the host what the node wrote.
const diskImageSize = 1 << 30

// diskImageName is a node's image file; the name is what tells a leftover of an earlier run
// (cleanupDisks) from any other loop device.
func diskImageName(i int) string { return fmt.Sprintf("chj-disk-n%d.img", i) }

// diskImagePattern matches a node image's path as losetup --raw lists it: a deleted one's
// gets " (deleted)", its space escaped.
var diskImagePattern = regexp.MustCompile(`/chj-disk-n[0-9]+\.img(( |\\x20)\(deleted\))?$`)

// disk is one node's filesystem.
type disk struct {
	image, dev, mountpoint string
}

// ballast is the file disk-full fills the filesystem with.
func (d *disk) ballast() string { return filepath.Join(d.mountpoint, "chj-ballast") }

// setupDisk makes node i's filesystem and mounts it at mountpoint, which must not exist
// or be empty.
func setupDisk(out string, i int, mountpoint string) (*disk, error) {
	d := &disk{image: filepath.Join(out, diskImageName(i)), mountpoint: mountpoint}
	f, err := os.OpenFile(d.image, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, err
	}
	err = f.Truncate(diskImageSize)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	b, err := exec.Command("losetup", "-f", "--show", d.image).Output()
	if err != nil {
		return nil, fmt.Errorf("losetup -f --show %s: %w", d.image, err)
	}
	d.dev = strings.TrimSpace(string(b))
	// -m 0: no blocks reserved for root, who chimed runs as, so that full means full.
	// lazy_itable_init=0: no background thread writing inode tables behind the test's back.
	if err := sh("mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=0,lazy_journal_init=0", d.dev); err != nil {
		d.teardown()
		return nil, err
	}
	if err := os.MkdirAll(mountpoint, 0o755); err != nil {
		d.teardown()
		return nil, err
	}
	if err := sh("mount", "-t", "ext4", d.dev, mountpoint); err != nil {
		d.teardown()
		return nil, err
	}
	// chimed takes the directory as its own; lost+found is mkfs's, and e2fsck makes it
	// again should it need one.
	if err := os.Remove(filepath.Join(mountpoint, "lost+found")); err != nil {
		d.teardown()
		return nil, err
	}
	return d, nil
}

// teardown thaws, unmounts and detaches the filesystem; each step may find nothing to do.
func (d *disk) teardown() {
	d.thaw()
	if d.mountpoint != "" {
		_ = exec.Command("umount", d.mountpoint).Run() // fails when it was never mounted
	}
	if d.dev != "" {
		_ = exec.Command("losetup", "-d", d.dev).Run() // fails when already detached
	}
}

// freeze blocks every write and fsync on the filesystem until thaw (FIFREEZE). The node's
// process keeps running and answering the network, only its disk hangs: the gray failure
// a slow or wedged disk is. SIGSTOP (the pause faults) stops the whole process instead, and
// cgroup v1's blkio throttling does not reach buffered writeback, so neither makes it.
func (d *disk) freeze() error { return sh("fsfreeze", "-f", d.mountpoint) }

// thaw ends a freeze. A filesystem that is not frozen answers EINVAL, which is no error
// here: thaw is called on every heal and teardown path, frozen or not, because a frozen
// filesystem cannot be unmounted and hangs whatever touches it later.
func (d *disk) thaw() {
	if d.mountpoint != "" {
		_ = exec.Command("fsfreeze", "-u", d.mountpoint).Run() // EINVAL when not frozen
	}
}

// fill takes every free block of the filesystem with ballast files: a fallocate of what
// statfs says is free, then smaller ones until not even a block fits (extents need metadata
// blocks too, so the first may not take it all).
func (d *disk) fill() error {
	var st syscall.Statfs_t
	if err := syscall.Statfs(d.mountpoint, &st); err != nil {
		return err
	}
	bsize := st.Bsize
	chunk := int64(st.Bavail) * bsize
	for k := 0; chunk >= bsize; k++ {
		name := d.ballast() + fmt.Sprint(k)
		f, err := os.OpenFile(name, os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return nil // not even an inode is left
			}
			return err
		}
		err = syscall.Fallocate(int(f.Fd()), 0, 0, chunk)
		_ = f.Close() // nothing was written through f
		switch {
		case err == nil:
		case errors.Is(err, syscall.ENOSPC):
			_ = os.Remove(name) // what it allocated went back; try a smaller one
			chunk /= 2
		default:
			return err
		}
	}
	return nil
}

// used is how much of the filesystem is taken, ballast included.
func (d *disk) used() (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(d.mountpoint, &st); err != nil {
		return 0, err
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize, nil
}

// empty removes the ballast.
func (d *disk) empty() error {
	names, err := filepath.Glob(d.ballast() + "*")
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range names {
		errs = append(errs, os.Remove(n))
	}
	return errors.Join(errs...)
}

// cleanupDisks thaws, unmounts and detaches what an earlier run that did not end cleanly
// left: the loop devices whose backing file is a node image (by name), and wherever they
// are mounted.
func cleanupDisks() {
	b, err := exec.Command("losetup", "--list", "--noheadings", "--raw", "--output", "NAME,BACK-FILE").Output()
	if err != nil {
		return // no loop devices, or no losetup: nothing of ours to clean
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		dev, back, ok := strings.Cut(line, " ")
		if !ok || !diskImagePattern.MatchString(back) {
			continue
		}
		for _, mp := range mountpointsOf(dev) {
			_ = exec.Command("fsfreeze", "-u", mp).Run() // EINVAL when not frozen
			// The crashed run's nodes died with it (Pdeathsig), but one that waited on
			// the frozen filesystem ends only now that it thawed, and holds the mount
			// until it has: a few tries, then losetup -d leaves what still fails.
			for try := 0; try < 10 && exec.Command("umount", mp).Run() != nil; try++ {
				time.Sleep(200 * time.Millisecond)
			}
		}
		_ = exec.Command("losetup", "-d", dev).Run() // best effort, as teardownNetwork
	}
}

// mountpointsOf lists where dev is mounted, from /proc/self/mountinfo.
func mountpointsOf(dev string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer func() { _ = f.Close() }() // read only
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID parent major:minor root mountpoint options ... - fstype source superopts
		fields := strings.Fields(sc.Text())
		for j, fl := range fields {
			if fl == "-" && j+2 < len(fields) && fields[j+2] == dev && len(fields) > 4 {
				out = append(out, unescapeMount(fields[4]))
			}
		}
	}
	return out
}

// unescapeMount undoes mountinfo's octal escapes of space, tab, newline and backslash.
func unescapeMount(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

// giveDisk makes n's filesystem, named by the number of its id (n7: chj-disk-n7.img), when
// the run has disks (diskDir set).
func (c *cluster) giveDisk(n *node) error {
	if c.diskDir == "" {
		return nil
	}
	var num int
	if _, err := fmt.Sscanf(n.id, "n%d", &num); err != nil {
		return fmt.Errorf("node %s's filesystem: its id has no number", n.id)
	}
	d, err := setupDisk(c.diskDir, num, n.dataDir)
	if d != nil {
		n.disk = d
	}
	if err != nil {
		return fmt.Errorf("node %s's filesystem: %w", n.id, err)
	}
	return nil
}
