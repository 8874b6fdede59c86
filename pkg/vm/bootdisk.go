package vm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// A boot disk is what an administrator's stock Linux image looks like to
// the VM backend (vm.images.linux, booted as DiskGuest): one qcow2 disk
// that boots by itself through UEFI firmware — no -kernel/-initrd from the
// host — and runs Debian's qemu-ga and nothing of ours. MakeBootDisk makes
// one from the Linux test guest so that this path is tested for real: the
// guest's kernel and initramfs go onto an EFI System Partition behind a
// GRUB at the removable-media path, its ext4 root onto a second partition.
// A VM of a disk guest has no sandbox-agent port (see Spec.args), so the
// guest's sandbox-init starts only qemu-ga, as in a stock image; the agent
// binary in the initramfs stays unused.
//
// Layout (GPT, 512-byte sectors, MiB-aligned):
//
//	partition 1  1 MiB, 64 MiB   EFI System Partition, FAT32, label SBXEFI:
//	             \EFI\BOOT\BOOTX64.EFI (grub-mkstandalone, grub.cfg in its memdisk),
//	             \vmlinuz, \initrd.img (the guest's)
//	partition 2  65 MiB, rest    Linux filesystem: the guest's ext4 root disk as it is
//
// GRUB boots the kernel with BootDiskCmdline: root=/dev/vda2 (the
// initramfs honours root=), console=ttyS0 last so that the serial console
// (console.log) shows the kernel, and init's messages. The firmware must be
// OVMF without Secure Boot (OVMFCode/OVMFVars: the GRUB and kernel here are
// not signed for Microsoft's keys); SeaBIOS cannot boot it (no BIOS boot
// code).
//
// No loop device, mount or root privilege is needed: the file systems are
// made on image files (mkfs.vfat, mtools' mcopy -i), the partition table
// with sfdisk on the disk image file, and qemu-img writes both partitions
// into it at their offsets (sparse) before converting it to qcow2.

// Boot disk geometry, in bytes.
const (
	bootDiskAlign = 1 << 20  // first partition start, alignment, and room for the backup GPT
	bootESPBytes  = 64 << 20 // kernel (14 MB) + initramfs (3-5 MB) + GRUB (3 MB), with room
)

// BootDiskCmdline is the kernel command line a boot disk's GRUB passes.
// no_timer_check is the one slow-host parameter (SlowHostKernelArgs) that
// is right under either accelerator: the disk is made once and booted
// under KVM or TCG, and without it a TCG boot on a busy host can die in
// the kernel's timer check.
const BootDiskCmdline = "root=/dev/vda2 console=tty0 console=ttyS0 panic=-1 no_timer_check"

// GPT partition type GUIDs.
const (
	gptTypeESP   = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
	gptTypeLinux = "0FC63DAF-8483-4772-8E79-3D69D8477DE4"
)

// MakeBootDisk writes to out a UEFI-bootable GPT qcow2 disk made from g, a
// guest made by PrepareGuest (its Kernel, Initrd and Disk): see the
// layout above. out is replaced atomically (a temporary file beside it is
// renamed); the intermediate raw images live in a temporary directory
// beside out and are removed, also on failure. Tools: qemu-img, sfdisk
// (fdisk), mkfs.vfat (dosfstools), mmd/mcopy (mtools), grub-mkstandalone
// (grub-common, with grub-efi-amd64-bin's x86_64-efi modules).
func MakeBootDisk(ctx context.Context, g *Guest, out string) error {
	if g == nil || g.Kernel == "" || g.Initrd == "" || g.Disk == "" {
		return errdefs.Invalidf("guest: a boot disk is made from a prepared guest (kernel, initramfs and root disk)")
	}
	if _, err := os.Stat("/usr/lib/grub/x86_64-efi/linux.mod"); err != nil {
		return errdefs.Unavailablef("GRUB's x86_64-efi modules are not installed (package grub-efi-amd64-bin; scripts/install-deps.sh)")
	}
	tmp, err := os.MkdirTemp(filepath.Dir(out), ".bootdisk-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	rootBytes, err := virtualSize(ctx, g.Disk)
	if err != nil {
		return err
	}
	rootBytes = (rootBytes + bootDiskAlign - 1) &^ (bootDiskAlign - 1)
	espStart := int64(bootDiskAlign)
	rootStart := espStart + bootESPBytes
	total := rootStart + rootBytes + bootDiskAlign // the backup GPT at the end

	// The FAT volume id tells GRUB which partition holds the kernel: the
	// guest's disk and initramfs name it, so that another disk attached to
	// the same VM is not taken for it.
	sum := sha256.Sum256([]byte(g.Disk + "\x00" + g.Initrd))
	volID := strings.ToUpper(hex.EncodeToString(sum[:4]))
	esp := filepath.Join(tmp, "esp.img")
	if err := makeESP(ctx, g, esp, tmp, volID); err != nil {
		return fmt.Errorf("EFI system partition: %w", err)
	}

	raw := filepath.Join(tmp, "disk.raw")
	f, err := os.Create(raw)
	if err != nil {
		return err
	}
	err = f.Truncate(total)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	sector := func(b int64) string { return strconv.FormatInt(b/512, 10) }
	table := "label: gpt\n" +
		"start=" + sector(espStart) + ", size=" + sector(bootESPBytes) + ", type=" + gptTypeESP + ", name=\"EFI\"\n" +
		"start=" + sector(rootStart) + ", size=" + sector(rootBytes) + ", type=" + gptTypeLinux + ", name=\"root\"\n"
	if _, err := runTool(ctx, table, "sfdisk", "--quiet", "--no-reread", "--no-tell-kernel", raw); err != nil {
		return err
	}
	// qemu-img writes each image into the disk at its partition's offset
	// (the raw driver's offset/size window; -n: the target exists), only
	// the data: the root's unused space stays a hole.
	for _, p := range []struct {
		src, format string
		off, size   int64
	}{
		{esp, "raw", espStart, bootESPBytes},
		{g.Disk, "qcow2", rootStart, rootBytes},
	} {
		if err := run(ctx, "qemu-img", "convert", "-q", "-n", "-f", p.format, p.src, "--target-image-opts",
			fmt.Sprintf("driver=raw,offset=%d,size=%d,file.driver=file,file.filename=%s", p.off, p.size, raw)); err != nil {
			return err
		}
	}
	part := out + ".tmp-" + strconv.Itoa(os.Getpid())
	defer os.Remove(part)
	if err := run(ctx, "qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", raw, part); err != nil {
		return err
	}
	return os.Rename(part, out)
}

// makeESP makes the FAT32 EFI System Partition image esp: GRUB at the
// removable-media path (what firmware boots without boot entries in its
// variables), the kernel and the initramfs.
func makeESP(ctx context.Context, g *Guest, esp, tmp, volID string) error {
	cfg := filepath.Join(tmp, "grub.cfg")
	// No menu: the commands run in order. GRUB writes to the serial port
	// too, so a boot that stops in GRUB shows why in console.log.
	// The partition map and file system modules are loaded explicitly: a
	// standalone GRUB does not autoload them for search. If the boot
	// fails, GRUB powers the machine off (QEMU exits) rather than waiting
	// at its prompt.
	grubCfg := "serial --unit=0 --speed=115200\n" +
		"terminal_input serial console\n" +
		"terminal_output serial console\n" +
		"insmod part_gpt\ninsmod fat\ninsmod all_video\n" +
		"search --no-floppy --fs-uuid --set=root " + strings.ToLower(volID[:4]+"-"+volID[4:]) + "\n" +
		"echo 'sandbox boot disk: loading the kernel'\n" +
		"linux /vmlinuz " + BootDiskCmdline + "\n" +
		"initrd /initrd.img\n" +
		"boot\n" +
		"echo 'sandbox boot disk: boot failed'\n" +
		"halt\n"
	if err := os.WriteFile(cfg, []byte(grubCfg), 0o644); err != nil {
		return err
	}
	efi := filepath.Join(tmp, "BOOTX64.EFI")
	// Standalone: every module and grub.cfg in the image's memdisk, so the
	// ESP needs no /boot/grub of its own.
	if err := run(ctx, "grub-mkstandalone", "-O", "x86_64-efi", "-o", efi,
		"--locales=", "--fonts=", "--themes=", "boot/grub/grub.cfg="+cfg); err != nil {
		return err
	}
	f, err := os.Create(esp)
	if err != nil {
		return err
	}
	err = f.Truncate(bootESPBytes)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := run(ctx, "mkfs.vfat", "-F", "32", "-n", "SBXEFI", "-i", volID, esp); err != nil {
		return err
	}
	if err := run(ctx, "mmd", "-i", esp, "::/EFI", "::/EFI/BOOT"); err != nil {
		return err
	}
	for _, c := range [][2]string{
		{efi, "::/EFI/BOOT/BOOTX64.EFI"},
		{g.Kernel, "::/vmlinuz"},
		{g.Initrd, "::/initrd.img"},
	} {
		if err := run(ctx, "mcopy", "-i", esp, c[0], c[1]); err != nil {
			return err
		}
	}
	return nil
}

// virtualSize is the size of a disk image as the guest sees it.
func virtualSize(ctx context.Context, img string) (int64, error) {
	out, err := runTool(ctx, "", "qemu-img", "info", "--output=json", img)
	if err != nil {
		return 0, err
	}
	var info struct {
		VirtualSize int64 `json:"virtual-size"`
	}
	if err := json.Unmarshal([]byte(out), &info); err != nil || info.VirtualSize <= 0 {
		return 0, fmt.Errorf("qemu-img info %s: no virtual size (%v)", img, err)
	}
	return info.VirtualSize, nil
}
