package vm

import (
	"os"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/config"
	"github.com/sandboxrunner/mcp-sandboxd/pkg/errdefs"
)

// OS names of guests.
const (
	OSLinux   = "linux"
	OSWindows = "windows"
)

// OVMF files of Debian's ovmf package. The .ms variables have Microsoft's
// keys enrolled (Windows 11 boots with Secure Boot on); the plain ones have
// no keys, so Secure Boot is off (the Linux guest's kernel is loaded
// directly, not through a signed shim).
const (
	OVMFCode       = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	OVMFVars       = "/usr/share/OVMF/OVMF_VARS_4M.fd"
	OVMFSecureCode = "/usr/share/OVMF/OVMF_CODE_4M.ms.fd"
	OVMFSecureVars = "/usr/share/OVMF/OVMF_VARS_4M.ms.fd"
)

// Profile is how VMs of one OS are made.
type Profile struct {
	OS string
	// Disk is an administrator-supplied base image (vm.images.<os>); empty
	// for Linux means the Linux test guest built by the image builder.
	Disk         string
	Firmware     *Firmware
	TPM          bool
	MinMemoryMiB int
	// DefaultMemoryMiB is a disk guest's RAM when the request names none
	// (0: the caller's default for our own guests).
	DefaultMemoryMiB int
	MinCPUs          int
}

// QGAOnly says that VMs of the profile boot an administrator's disk whose
// guest runs only the QEMU guest agent (no sandbox-agent).
func (p *Profile) QGAOnly() bool { return p.Disk != "" }

// ResolveProfile returns the profile of os under the vm section of the
// configuration. Windows needs an image an administrator prepared (an
// unattended install with virtio-win drivers and qemu-ga; see README):
// without vm.images.windows it is unavailable, and the error names the key.
func ResolveProfile(cfg *config.VM, os string) (*Profile, error) {
	switch os {
	case OSLinux:
		disk := cfg.Images[OSLinux]
		if disk == "" {
			return &Profile{OS: os, MinMemoryMiB: 128, MinCPUs: 1}, nil
		}
		if err := fileReadable(disk); err != nil {
			return nil, errdefs.Wrap(errdefs.Unavailable, err, "vm.images.linux: %s", disk)
		}
		// An administrator's Linux disk boots through its own boot loader
		// under UEFI (OVMF), without Secure Boot: current distributions'
		// cloud and installer images boot UEFI (most also BIOS), and a
		// disk an administrator built need not carry a shim signed with
		// Microsoft's keys. The machine (q35) is the one our guests use.
		return &Profile{
			OS: os, Disk: disk,
			Firmware:     &Firmware{Code: OVMFCode, Vars: OVMFVars},
			MinMemoryMiB: 256, DefaultMemoryMiB: 1024, MinCPUs: 1,
		}, nil
	case OSWindows:
		disk := cfg.Images[OSWindows]
		if disk == "" {
			return nil, errdefs.Unavailablef("os: windows VMs need a prepared base image; set vm.images.windows in the configuration (see README, \"Windows guests\")")
		}
		if err := fileReadable(disk); err != nil {
			return nil, errdefs.Wrap(errdefs.Unavailable, err, "vm.images.windows: %s", disk)
		}
		// q35, OVMF with per-VM Secure Boot variables (Microsoft keys
		// enrolled), a TPM 2.0: what Windows 11 requires. 4 GiB and two
		// vCPUs are its installer's minimum.
		return &Profile{
			OS: os, Disk: disk,
			Firmware:     &Firmware{Code: OVMFSecureCode, Vars: OVMFSecureVars, SecureBoot: true},
			TPM:          true,
			MinMemoryMiB: 4096, DefaultMemoryMiB: 4096, MinCPUs: 2,
		}, nil
	default:
		return nil, errdefs.Invalidf("os: %q is not linux or windows", os)
	}
}

func fileReadable(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	return f.Close()
}
