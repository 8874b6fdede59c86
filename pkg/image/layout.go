package image

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"
)

// Paths every image provides, for the runtime and the agent.
const (
	// WorkspaceDir is where the sandbox's files live; the runtime mounts
	// the per-sandbox workspace (Layers.Workspace) here.
	WorkspaceDir = "/workspace"
	// AgentDir is the empty mount point for the sandbox agent.
	AgentDir = "/.sandboxd"
)

// hostsFile names only loopback: a sandbox's hostname is not known when the
// image is built, and nothing in it may resolve to the build host.
const hostsFile = `127.0.0.1	localhost
::1	localhost ip6-localhost ip6-loopback
ff02::1	ip6-allnodes
ff02::2	ip6-allrouters
`

// finalise puts on top of the installed packages what every sandbox relies
// on. All paths go through os.Root: the tree is full of absolute symlinks
// (/etc/alternatives, ...) that, followed from the host, would point into
// the host's own file system.
func finalise(rootPath string, r *Recipe) error {
	root, err := os.OpenRoot(rootPath)
	if err != nil {
		return err
	}
	defer root.Close()

	steps := []struct {
		what string
		do   func(*os.Root, *Recipe) error
	}{
		{"clear /dev", clearDev},
		{"write network files", writeNetworkFiles},
		{"install files", installFiles},
		{"add user", addUser},
		{"create sandbox directories", makeSandboxDirs},
	}
	for _, s := range steps {
		if err := s.do(root, r); err != nil {
			return fmt.Errorf("%s: %w", s.what, err)
		}
	}
	return nil
}

// clearDev empties /dev. mmdebstrap creates device nodes there in root
// mode; the runtime gives every container its own /dev, and a lower layer
// with device nodes is only a liability.
func clearDev(root *os.Root, _ *Recipe) error {
	if err := root.RemoveAll("dev"); err != nil {
		return err
	}
	return mkdir(root, "dev", 0o755, 0, 0)
}

// writeNetworkFiles makes /etc/hostname and /etc/resolv.conf empty files
// (mmdebstrap copies the build host's; the runtime bind-mounts each
// sandbox's own over them) and writes a loopback-only /etc/hosts.
func writeNetworkFiles(root *os.Root, _ *Recipe) error {
	for name, content := range map[string]string{
		"etc/hosts":       hostsFile,
		"etc/hostname":    "",
		"etc/resolv.conf": "",
	} {
		if err := replaceFile(root, name, []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func installFiles(root *os.Root, r *Recipe) error {
	for i, f := range r.Files {
		src, err := r.sourcePath(f)
		if err != nil {
			return fmt.Errorf("files[%d]: %w", i, err)
		}
		data, err := os.ReadFile(src)
		if err != nil {
			return fmt.Errorf("files[%d]: %w", i, err)
		}
		dest := strings.TrimPrefix(f.Dest, "/")
		if err := root.MkdirAll(path.Dir(dest), 0o755); err != nil {
			return fmt.Errorf("files[%d]: %w", i, err)
		}
		if err := replaceFile(root, dest, data, f.Mode); err != nil {
			return fmt.Errorf("files[%d]: %w", i, err)
		}
	}
	return nil
}

// addUser writes the sandbox user's entries straight into the account
// files: minbase has no useradd (it is in passwd, which is not essential).
func addUser(root *os.Root, r *Recipe) error {
	u := r.User
	if err := checkFree(root, "etc/passwd", u.Name, u.UID, 2); err != nil {
		return fmt.Errorf("user: %w", err)
	}
	if err := checkFree(root, "etc/group", u.Name, u.GID, 2); err != nil {
		return fmt.Errorf("user: %w", err)
	}
	entries := []struct {
		file, line string
		optional   bool
	}{
		{"etc/passwd", fmt.Sprintf("%s:x:%d:%d:%s:%s:%s", u.Name, u.UID, u.GID, u.Name, u.Home, u.Shell), false},
		{"etc/group", fmt.Sprintf("%s:x:%d:", u.Name, u.GID), false},
		// "!" locks the password: the account is entered only by the
		// runtime setting the uid, never by logging in.
		{"etc/shadow", fmt.Sprintf("%s:!::0:99999:7:::", u.Name), false},
		{"etc/gshadow", fmt.Sprintf("%s:!::", u.Name), true},
	}
	for _, e := range entries {
		if err := appendLine(root, e.file, e.line); err != nil {
			if e.optional && errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return err
		}
	}

	home := strings.TrimPrefix(u.Home, "/")
	if err := root.MkdirAll(path.Dir(home), 0o755); err != nil {
		return err
	}
	if err := mkdir(root, home, 0o755, u.UID, u.GID); err != nil {
		return err
	}
	return copySkel(root, home, u)
}

// checkFree fails if a colon-separated account file already has an entry
// with name or with id in field idField.
func checkFree(root *os.Root, file, name string, id, idField int) error {
	data, err := root.ReadFile(file)
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Split(sc.Text(), ":")
		if len(f) <= idField {
			continue
		}
		if f[0] == name {
			return fmt.Errorf("/%s already has an entry named %q", file, name)
		}
		if f[idField] == strconv.Itoa(id) {
			return fmt.Errorf("/%s already uses id %d (for %q)", file, id, f[0])
		}
	}
	return sc.Err()
}

// copySkel gives the user the shell start-up files from /etc/skel, as
// useradd -m would.
func copySkel(root *os.Root, home string, u UserSpec) error {
	dir, err := root.Open("etc/skel")
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	entries, err := dir.ReadDir(-1)
	dir.Close()
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		data, err := root.ReadFile(path.Join("etc/skel", e.Name()))
		if err != nil {
			return err
		}
		dest := path.Join(home, e.Name())
		if err := replaceFile(root, dest, data, 0o644); err != nil {
			return err
		}
		if err := root.Lchown(dest, u.UID, u.GID); err != nil {
			return err
		}
	}
	return nil
}

// makeSandboxDirs creates /workspace with input/ and output/, owned by the
// user, and the agent's mount point, owned by root.
func makeSandboxDirs(root *os.Root, r *Recipe) error {
	ws := strings.TrimPrefix(WorkspaceDir, "/")
	for _, d := range []string{ws, ws + "/input", ws + "/output"} {
		if err := mkdir(root, d, 0o755, r.User.UID, r.User.GID); err != nil {
			return err
		}
	}
	return mkdir(root, strings.TrimPrefix(AgentDir, "/"), 0o755, 0, 0)
}

// mkdir creates dir (or adopts an existing directory) with exactly the given
// mode and owner, whatever the umask.
func mkdir(root *os.Root, dir string, mode fs.FileMode, uid, gid int) error {
	if err := root.Mkdir(dir, mode); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	if err := root.Lchown(dir, uid, gid); err != nil {
		return err
	}
	return root.Chmod(dir, mode)
}

// replaceFile writes name afresh, owned by root with mode. An existing
// entry is removed first rather than truncated, so a symlink there is
// replaced, not followed.
func replaceFile(root *os.Root, name string, data []byte, mode FileMode) error {
	if err := root.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return root.Chmod(name, mode.fsMode())
}

// appendLine appends line to an existing file, keeping its mode and owner
// (/etc/shadow is 0640 root:shadow).
func appendLine(root *os.Root, name, line string) error {
	data, err := root.ReadFile(name)
	if err != nil {
		return err
	}
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		line = "\n" + line
	}
	if _, err := f.WriteString(line + "\n"); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// fsMode converts the Unix permission bits to an fs.FileMode, whose
// setuid, setgid and sticky bits are not at their Unix positions.
func (m FileMode) fsMode() fs.FileMode {
	mode := fs.FileMode(m) & fs.ModePerm
	if m&0o4000 != 0 {
		mode |= fs.ModeSetuid
	}
	if m&0o2000 != 0 {
		mode |= fs.ModeSetgid
	}
	if m&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	return mode
}
