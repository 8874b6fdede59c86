package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sandboxrunner/mcp-sandboxd/pkg/agent"
)

// The agent's binary called as "sudo" (images link /usr/bin/sudo to it) is
// the client of the sudo channel: see pkg/agent/sudo.go for why sudo cannot
// be set-uid here and what the channel allows.

// securePath is the PATH of commands run through sudo, as Debian's
// sudoers sets it (secure_path).
const securePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// keptEnv is what sudo's env_reset keeps of the caller's environment.
var keptEnv = []string{"TERM", "COLORTERM", "DISPLAY", "LANG", "LANGUAGE", "LC_ALL", "TZ", "XAUTHORITY"}

// sudoOptions is the parsed command line.
type sudoOptions struct {
	user, group  string
	preserveEnv  bool
	login, shell bool
	argv         []string
}

// sudoMain runs sudo's command line and returns its exit status.
func sudoMain(args []string) int {
	o, status, done := parseSudo(args)
	if done {
		return status
	}
	target, err := lookupUser(o.user)
	if err != nil {
		fmt.Fprintf(os.Stderr, "sudo: %v\n", err)
		return 1
	}
	if o.group != "" {
		if target.gid, err = lookupGroup(o.group); err != nil {
			fmt.Fprintf(os.Stderr, "sudo: %v\n", err)
			return 1
		}
	}
	req, err := sudoRequest(o, target)
	if err != nil {
		fmt.Fprintf(os.Stderr, "sudo: %v\n", err)
		return 1
	}
	if os.Geteuid() == 0 {
		// Already root (a root-mode sandbox whose user is root): become
		// the target and run the command here, as sudo would.
		return execAs(req)
	}
	return runThroughAgent(req)
}

// parseSudo parses the options sudo users rely on; done says the command
// line was handled entirely (help, version, a no-op, an error).
func parseSudo(args []string) (o sudoOptions, status int, done bool) {
	o.user = "root"
	for len(args) > 0 && strings.HasPrefix(args[0], "-") && args[0] != "-" {
		a := args[0]
		args = args[1:]
		if a == "--" {
			break
		}
		if strings.HasPrefix(a, "--") {
			args, status, done = o.parseLong(a[2:], args)
		} else {
			args, status, done = o.parseShort(a, args)
		}
		if done {
			return o, status, true
		}
	}
	o.argv = args
	if len(o.argv) == 0 && !o.login && !o.shell {
		return o, usage("a command is needed"), true
	}
	return o, 0, false
}

// parseLong parses one long option opt (without its "--"), taking its
// value from args when it is not given with "="; it returns what is left
// of args.
func (o *sudoOptions) parseLong(opt string, args []string) (rest []string, status int, done bool) {
	name, val, hasVal := strings.Cut(opt, "=")
	switch name {
	case "preserve-env":
		o.preserveEnv = true
	case "login":
		o.login = true
	case "shell":
		o.shell = true
	case "non-interactive", "set-home", "stdin":
	case "user", "group":
		if !hasVal {
			if len(args) == 0 {
				return args, usage("option --" + name + " needs a value"), true
			}
			val, args = args[0], args[1:]
		}
		if name == "user" {
			o.user = val
		} else {
			o.group = val
		}
	case "version":
		fmt.Println("Sudo version 1.9 (mcp-sandboxd agent: the sandbox's sudo channel)")
		return args, 0, true
	case "help":
		return args, usage(""), true
	default:
		return args, usage("option --" + name + " is not supported in this sandbox"), true
	}
	return args, 0, false
}

// parseShort parses one group of short options a ("-Eu" "user"), taking
// an option's value from args when the group ends with it; it returns what
// is left of args.
func (o *sudoOptions) parseShort(a string, args []string) (rest []string, status int, done bool) {
	for i := 1; i < len(a); i++ {
		switch c := a[i]; c {
		case 'E':
			o.preserveEnv = true
		case 'i':
			o.login = true
		case 's':
			o.shell = true
		case 'n', 'H', 'S', 'b', 'P':
			// Nothing to ask for and the home is always set; -S and -b
			// have no meaning without a password or a terminal to keep.
		case 'k', 'K', 'v':
			if len(a) == 2 && len(args) == 0 {
				return args, 0, true // no cached credentials to drop or extend
			}
		case 'u', 'g':
			val := a[i+1:]
			if val == "" {
				if len(args) == 0 {
					return args, usage(fmt.Sprintf("option -%c needs a value", c)), true
				}
				val, args = args[0], args[1:]
			}
			if c == 'u' {
				o.user = val
			} else {
				o.group = val
			}
			i = len(a)
		case 'l':
			if len(args) == 0 {
				fmt.Println("User may run the following commands in this sandbox:\n    (ALL : ALL) NOPASSWD: ALL")
				return args, 0, true
			}
		case 'V':
			fmt.Println("Sudo version 1.9 (mcp-sandboxd agent: the sandbox's sudo channel)")
			return args, 0, true
		case 'h':
			return args, usage(""), true
		default:
			return args, usage(fmt.Sprintf("option -%c is not supported in this sandbox", c)), true
		}
	}
	return args, 0, false
}

func usage(problem string) int {
	if problem != "" {
		fmt.Fprintf(os.Stderr, "sudo: %s\n", problem)
	}
	fmt.Fprintln(os.Stderr, "usage: sudo [-EHinsS] [-u user] [-g group] [--] command [arg ...]\n       sudo -i | -s [command]\n       sudo -l | -V | -h | -k | -v")
	if problem == "" {
		return 0
	}
	return 1
}

// account is an entry of /etc/passwd.
type account struct {
	name             string
	uid, gid         int
	home, loginShell string
}

// lookupUser finds name ("root", "user", "#1000") in /etc/passwd.
func lookupUser(name string) (account, error) {
	byID := -1
	if n, ok := strings.CutPrefix(name, "#"); ok {
		id, err := strconv.Atoi(n)
		if err != nil || id < 0 {
			return account{}, fmt.Errorf("unknown user %s", name)
		}
		byID = id
	}
	var found *account
	_ = scanColonFile("/etc/passwd", func(f []string) bool {
		if len(f) < 7 {
			return false
		}
		uid, err1 := strconv.Atoi(f[2])
		gid, err2 := strconv.Atoi(f[3])
		if err1 != nil || err2 != nil || (f[0] != name && uid != byID) {
			return false
		}
		found = &account{name: f[0], uid: uid, gid: gid, home: f[5], loginShell: f[6]}
		return true
	})
	switch {
	case found != nil:
		return *found, nil
	case byID >= 0:
		return account{name: "#" + strconv.Itoa(byID), uid: byID, gid: byID, home: "/", loginShell: "/bin/sh"}, nil
	}
	return account{}, fmt.Errorf("unknown user %s", name)
}

// lookupGroup finds a group's id in /etc/group ("#N" is N).
func lookupGroup(name string) (int, error) {
	if n, ok := strings.CutPrefix(name, "#"); ok {
		if id, err := strconv.Atoi(n); err == nil && id >= 0 {
			return id, nil
		}
		return 0, fmt.Errorf("unknown group %s", name)
	}
	gid := -1
	_ = scanColonFile("/etc/group", func(f []string) bool {
		if len(f) >= 3 && f[0] == name {
			gid, _ = strconv.Atoi(f[2])
			return true
		}
		return false
	})
	if gid < 0 {
		return 0, fmt.Errorf("unknown group %s", name)
	}
	return gid, nil
}

func scanColonFile(path string, match func([]string) bool) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if match(strings.Split(sc.Text(), ":")) {
			return nil
		}
	}
	return sc.Err()
}

// sudoRequest works out the command line, environment and directory.
func sudoRequest(o sudoOptions, t account) (agent.SudoRequest, error) {
	cwd, err := os.Getwd()
	if err != nil {
		cwd = "/"
	}
	shell := t.loginShell
	if shell == "" {
		shell = "/bin/sh"
	}
	argv := o.argv
	switch {
	case o.login:
		argv = []string{shell, "-l"}
		if len(o.argv) > 0 {
			argv = append(argv, "-c", strings.Join(o.argv, " "))
		}
		cwd = t.home
	case o.shell:
		if s := os.Getenv("SHELL"); s != "" {
			shell = s
		}
		argv = []string{shell}
		if len(o.argv) > 0 {
			argv = append(argv, "-c", strings.Join(o.argv, " "))
		}
	}
	var env []string
	if o.preserveEnv {
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "SUDO_") && !strings.HasPrefix(kv, "PATH=") {
				env = append(env, kv)
			}
		}
	} else {
		for _, k := range keptEnv {
			if v, ok := os.LookupEnv(k); ok {
				env = append(env, k+"="+v)
			}
		}
		for _, kv := range os.Environ() {
			if strings.HasPrefix(kv, "LC_") {
				env = append(env, kv)
			}
		}
		env = append(env, "HOME="+t.home, "USER="+t.name, "LOGNAME="+t.name, "SHELL="+shell, "MAIL=/var/mail/"+t.name)
	}
	me := "unknown"
	if a, err := lookupUser("#" + strconv.Itoa(os.Getuid())); err == nil {
		me = a.name
	}
	env = append(env, "PATH="+securePath, "SUDO_USER="+me, "SUDO_UID="+strconv.Itoa(os.Getuid()),
		"SUDO_GID="+strconv.Itoa(os.Getgid()), "SUDO_COMMAND="+strings.Join(argv, " "))
	return agent.SudoRequest{Argv: argv, Env: env, Cwd: cwd, UID: t.uid, GID: t.gid}, nil
}

// execAs replaces this process with the command as the target identity.
func execAs(req agent.SudoRequest) int {
	path, err := lookPathIn(req.Argv[0], securePath)
	if err == nil && req.Cwd != "" {
		err = os.Chdir(req.Cwd)
	}
	if err == nil {
		err = syscall.Setgroups([]int{req.GID})
	}
	if err == nil {
		err = syscall.Setgid(req.GID)
	}
	if err == nil {
		err = syscall.Setuid(req.UID)
	}
	if err == nil {
		err = syscall.Exec(path, req.Argv, req.Env)
	}
	fmt.Fprintf(os.Stderr, "sudo: %s: %v\n", req.Argv[0], err)
	return 1
}

func lookPathIn(name, path string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	for _, dir := range strings.Split(path, ":") {
		p := dir + "/" + name
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errors.New("command not found")
}

// runThroughAgent asks the agent to run req on our standard descriptors,
// forwards the signals we get, and returns the command's exit status.
func runThroughAgent(req agent.SudoRequest) int {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: agent.SudoSocket, Net: "unix"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "sudo: this sandbox has no root to give: sudo works in sandboxes created in root mode (E2B sandboxes, or sandbox_create with root: true)")
		return 1
	}
	defer c.Close()
	line, err := json.Marshal(req)
	if err != nil {
		fmt.Fprintf(os.Stderr, "sudo: %v\n", err)
		return 1
	}
	line = append(line, '\n')
	if _, _, err := c.WriteMsgUnix(line, unix.UnixRights(0, 1, 2), nil); err != nil {
		fmt.Fprintf(os.Stderr, "sudo: %v\n", err)
		return 1
	}
	// The command is in a session of its own, out of our terminal's
	// foreground group: the signals a terminal or a kill sends us go to it.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, unix.SIGINT, unix.SIGTERM, unix.SIGHUP, unix.SIGQUIT, unix.SIGUSR1, unix.SIGUSR2)
	enc := json.NewEncoder(c)
	go func() {
		for s := range sigs {
			_ = enc.Encode(agent.SudoMessage{Signal: strconv.Itoa(int(s.(syscall.Signal)))})
		}
	}()
	var m agent.SudoMessage
	if err := json.NewDecoder(c).Decode(&m); err != nil {
		fmt.Fprintf(os.Stderr, "sudo: the sandbox agent went away: %v\n", err)
		return 1
	}
	if m.Exit == nil {
		fmt.Fprintf(os.Stderr, "sudo: %s\n", m.Error)
		return 1
	}
	return m.Exit.ExitCode
}
