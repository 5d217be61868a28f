package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kiln-llm/kiln/server"
)

// The background daemon is "kiln serve" re-executed detached, with its pid
// and log files beside its socket.

func init() {
	register(&command{name: "start", summary: "start the background daemon (takes kiln serve's flags)", run: startDaemon})
	register(&command{name: "stop", summary: "stop the background daemon, letting in-flight requests finish", run: stopDaemon})
	register(&command{name: "status", summary: "show whether the daemon runs, its model, uptime and engine statistics", run: daemonStatus})
}

// daemonFiles are the paths of a daemon whose socket is sock.
type daemonFiles struct{ sock, pid, log string }

func filesFor(sock string) daemonFiles {
	dir := filepath.Dir(sock)
	base := strings.TrimSuffix(filepath.Base(sock), filepath.Ext(sock))
	return daemonFiles{sock: sock, pid: filepath.Join(dir, base+".pid"), log: filepath.Join(dir, base+".log")}
}

// socketClient is an HTTP client whose every request goes to the Unix socket
// at path (the URL's host is ignored).
func socketClient(path string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}}
}

// daemonStatusOf asks the daemon at sock for its status; an error means no
// daemon answers there.
func daemonStatusOf(sock string) (*server.Status, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://kiln/status", nil)
	resp, err := socketClient(sock).Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status: %s", resp.Status)
	}
	var st server.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return nil, err
	}
	return &st, nil
}

// daemonSocket parses the flags of start/stop/status (extra adds the
// command's own) and returns the daemon's socket path.
func daemonSocket(name string, args []string, extra func(*flag.FlagSet)) (string, *flag.FlagSet, error) {
	fs := flag.NewFlagSet("kiln "+name, flag.ContinueOnError)
	if extra != nil {
		extra(fs)
	}
	if fs.Lookup("socket") == nil {
		fs.String("socket", "", "daemon socket (default $XDG_RUNTIME_DIR/kiln/kiln.sock or ~/.kiln/kiln.sock)")
	}
	if err := parseFlags(fs, args); err != nil {
		return "", nil, err
	}
	if fs.NArg() > 0 {
		return "", nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	sockFlag := fs.Lookup("socket").Value.String()
	if sockFlag == "none" {
		return "", nil, errors.New("the daemon needs a socket")
	}
	sock, err := socketPath(sockFlag)
	return sock, fs, err
}

func startDaemon(args []string) error {
	var c serveConfig
	var wait time.Duration
	sock, _, err := daemonSocket("start", args, func(fs *flag.FlagSet) {
		c.register(fs)
		fs.DurationVar(&wait, "wait", 5*time.Minute, "how long to wait for the daemon to load its model")
	})
	if err != nil {
		return err
	}
	f := filesFor(sock)
	if st, err := daemonStatusOf(sock); err == nil {
		return fmt.Errorf("a daemon is already running (pid %d, model %s); 'kiln stop' first", st.PID, st.Model)
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(f.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	logStart, _ := logf.Seek(0, io.SeekEnd)
	// Pass on every serve flag the user set, plus where the daemon's files go.
	serveArgs := append([]string{"serve", "--socket", sock, "--pid-file", f.pid},
		withoutFlag(withoutFlag(args, "wait"), "socket")...)
	cmd := exec.Command(exe, serveArgs...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // survive the terminal
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return fmt.Errorf("the daemon exited during startup (%v); its log:\n%s", err, logTail(f.log, logStart))
		case <-time.After(100 * time.Millisecond):
		}
		if st, err := daemonStatusOf(sock); err == nil {
			fmt.Printf("kiln daemon running: pid %d, model %s\n  socket %s\n  log    %s\n", st.PID, st.Model, sock, f.log)
			return nil
		}
	}
	cmd.Process.Signal(syscall.SIGTERM)
	return fmt.Errorf("the daemon did not become ready within %v; its log:\n%s", wait, logTail(f.log, logStart))
}

// withoutFlag returns args without the flag --name (which takes a value)
// and its value.
func withoutFlag(args []string, name string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		a := strings.TrimLeft(args[i], "-")
		if a == name {
			i++ // its value
			continue
		}
		if strings.HasPrefix(a, name+"=") {
			continue
		}
		out = append(out, args[i])
	}
	return out
}

// logTail returns what the log got since offset, at most its last 4 kB.
func logTail(path string, offset int64) string {
	b, err := os.ReadFile(path)
	if err != nil || int64(len(b)) < offset {
		return ""
	}
	b = b[offset:]
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return string(bytes.TrimSpace(b))
}

func readPID(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// removeOwnPIDFile removes the pid file only while it holds pid: a daemon
// that replaced pid's while it drained has written its own.
func removeOwnPIDFile(path string, pid int) {
	if p, err := readPID(path); err == nil && p == pid {
		os.Remove(path)
	}
}

// isDaemon reports whether the live process pid is the daemon of sock, whose
// pid file is pidFile: it answers on the socket with that pid or, when it
// does not answer (hung), its command line names the pid file. A pid file
// outlives a daemon killed with SIGKILL, and by the time of "kiln stop" its
// pid may belong to an unrelated process, which must not be signalled.
// Without /proc (not Linux) a silent process is taken at its word.
func isDaemon(pid int, sock, pidFile string) bool {
	if st, err := daemonStatusOf(sock); err == nil {
		return st.PID == pid
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		_, serr := os.Stat("/proc/self/cmdline")
		return serr != nil
	}
	return bytes.Contains(cmdline, []byte("\x00"+pidFile+"\x00"))
}

func stopDaemon(args []string) error {
	var timeout time.Duration
	sock, _, err := daemonSocket("stop", args, func(fs *flag.FlagSet) {
		fs.DurationVar(&timeout, "timeout", time.Minute, "how long to wait for the daemon to drain and exit before killing it")
	})
	if err != nil {
		return err
	}
	f := filesFor(sock)
	pid, err := readPID(f.pid)
	if err != nil {
		// Without a pid file, ask the daemon itself who it is.
		st, serr := daemonStatusOf(sock)
		if serr != nil {
			return errors.New("no daemon is running")
		}
		pid = st.PID
	}
	if !alive(pid) || !isDaemon(pid, sock, f.pid) {
		os.Remove(f.pid)
		return errors.New("no daemon is running (removed a stale pid file)")
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("signalling pid %d: %w", pid, err)
	}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if !alive(pid) {
			fmt.Printf("kiln daemon stopped (pid %d)\n", pid)
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	if _, err := daemonStatusOf(sock); err != nil { // not a successor's
		os.Remove(sock)
	}
	removeOwnPIDFile(f.pid, pid)
	return fmt.Errorf("the daemon (pid %d) did not exit within %v and was killed", pid, timeout)
}

func daemonStatus(args []string) error {
	sock, _, err := daemonSocket("status", args, nil)
	if err != nil {
		return err
	}
	st, err := daemonStatusOf(sock)
	if err != nil {
		return fmt.Errorf("no daemon is running at %s", sock)
	}
	up := time.Duration(st.UptimeS * float64(time.Second)).Round(time.Second)
	fmt.Printf("kiln daemon: running, pid %d, up %v\n", st.PID, up)
	fmt.Printf("  model     %s", st.Model)
	if d := st.Info["model_dir"]; d != "" {
		fmt.Printf(" (%s)", d)
	}
	fmt.Printf("\n  backend   %s\n  socket    %s\n", st.Info["backend"], sock)
	if a := st.Info["tcp"]; a != "" {
		fmt.Printf("  http      http://%s/v1\n", a)
	}
	s := st.Stats
	fmt.Printf("  requests  %d running, %d waiting, %d in flight, %d completed\n", s.Running, s.Waiting, st.InFlight, s.RequestsCompleted)
	fmt.Printf("  kv cache  %d / %d blocks in use, %d of them kept by the cache for reuse\n", s.KVBlocksUsed, s.KVBlocksTotal, s.KVBlocksCached)
	hit := 0.0
	if s.PromptTokens > 0 {
		hit = 100 * float64(s.CacheHitTokens) / float64(s.PromptTokens)
	}
	fmt.Printf("  prompts   %d tokens, %.1f%% from cache; %d preemptions\n", s.PromptTokens, hit, s.Preemptions)
	if s.StateSnapshots > 0 {
		fmt.Printf("  states    %d snapshots, %d on the device, %s in host memory\n", s.StateSnapshots, s.StateOnDevice, humanBytes(s.StateBytes))
	}
	if n := len(st.Conversations); n > 0 {
		var dev int64
		for _, c := range st.Conversations {
			dev += c.DeviceBytes
		}
		fmt.Printf("  chats     %d kept, %s of device memory (shared blocks counted in each)\n", n, humanBytes(dev))
	}
	if s.StateCacheEntries > 0 {
		fmt.Printf("  cache     %d entries, %s in host memory, %s on disk; %d conversations restored from it\n",
			s.StateCacheEntries, humanBytes(s.StateCacheRAMBytes), humanBytes(s.StateCacheDiskBytes), s.StateCacheRestores)
	}
	return nil
}
