package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kiln-llm/kiln/server"
)

const defaultAddr = "127.0.0.1:11435"

func init() {
	register(&command{
		name:    "serve",
		summary: "serve the OpenAI and Ollama APIs in the foreground (TCP and a Unix socket)",
		run: func(args []string) error {
			var c serveConfig
			fs := flag.NewFlagSet("kiln serve", flag.ContinueOnError)
			c.register(fs)
			if err := parseFlags(fs, args); err != nil {
				return err
			}
			if fs.NArg() > 0 {
				return fmt.Errorf("unexpected arguments %q", fs.Args())
			}
			return c.serve()
		},
	})
}

// serveConfig holds the flags of "kiln serve", which "kiln start" passes on.
type serveConfig struct {
	model          modelFlags
	addr           string
	socket         string
	apiKey         string
	drainTimeout   time.Duration
	requestTimeout time.Duration
	writeTimeout   time.Duration
	maxBody        int64
	pidFile        string
	origins        []string
	hosts          []string
	verbose        bool
	stateCache     stateCacheFlags
}

func (c *serveConfig) register(fs *flag.FlagSet) {
	c.model.register(fs)
	fs.StringVar(&c.addr, "addr", defaultAddr, "TCP address to listen on; \"none\" for none. Beyond loopback it requires --api-key")
	fs.StringVar(&c.socket, "socket", "", "Unix socket path (default $XDG_RUNTIME_DIR/kiln/kiln.sock or ~/.kiln/kiln.sock); \"none\" for none")
	fs.StringVar(&c.apiKey, "api-key", os.Getenv("KILN_API_KEY"), "API key TCP clients must send as a bearer token (default $KILN_API_KEY)")
	fs.DurationVar(&c.drainTimeout, "drain-timeout", 30*time.Second, "on SIGTERM/SIGINT, how long in-flight requests may finish before they are cancelled")
	fs.DurationVar(&c.requestTimeout, "request-timeout", 10*time.Minute, "longest time one generation may take")
	fs.DurationVar(&c.writeTimeout, "write-timeout", 10*time.Second, "how long a streaming client may read nothing while its answer waits before the stream is cancelled")
	fs.Int64Var(&c.maxBody, "max-body", 0, "largest request body in bytes (default: the largest request whose prompt can fit the context)")
	fs.StringVar(&c.pidFile, "pid-file", "", "write the process id here while serving (kiln start sets it)")
	listFlag(fs, "allowed-origins", "comma-separated browser origins that may call the API (CORS), * for any part (https://*.example.com) or any origin; this machine's pages (http://localhost:*, 127.0.0.1, [::1]) always may",
		&c.origins, func(o string) string { return strings.TrimSuffix(o, "/") }, server.CheckOrigins)
	listFlag(fs, "allowed-hosts", "comma-separated host names, beyond localhost, this machine's addresses and name, that the server answers to without --api-key (patterns with *); others are refused, against DNS rebinding",
		&c.hosts, strings.ToLower, server.CheckHosts)
	fs.BoolVar(&c.verbose, "v", false, "debug logging")
	c.stateCache.register(fs)
}

// socketPath resolves the socket flag: "" is the default path (its
// directory created private), "none" is no socket.
func socketPath(flagValue string) (string, error) {
	switch flagValue {
	case "none":
		return "", nil
	case "":
		dir, err := server.DefaultSocketDir()
		if err != nil {
			return "", err
		}
		if err := server.PrivateDir(dir); err != nil {
			return "", fmt.Errorf("creating %s: %w", dir, err)
		}
		return filepath.Join(dir, "kiln.sock"), nil
	}
	return filepath.Abs(flagValue)
}

// checkExposure refuses to listen beyond loopback without an API key.
func checkExposure(addr, apiKey string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--addr %q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	if apiKey == "" {
		return fmt.Errorf("--addr %s listens beyond this machine: set --api-key (or $KILN_API_KEY)", addr)
	}
	return nil
}

// parseFlags parses args; -h prints the usage and exits 0, as a request for
// help is no error.
func parseFlags(fs *flag.FlagSet, args []string) error {
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		return errBadFlags{err}
	}
	return nil
}

// errBadFlags is a flag the flag package refused; it has printed the error
// and the command's usage already.
type errBadFlags struct{ error }

// setupLogging logs to stderr at level, or debug when verbose.
func setupLogging(verbose bool, level slog.Level) {
	if verbose {
		level = slog.LevelDebug
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})))
}

func (c *serveConfig) serve() error {
	setupLogging(c.verbose, slog.LevelInfo)
	sock, err := socketPath(c.socket)
	if err != nil {
		return err
	}
	if c.addr == "none" {
		c.addr = ""
	}
	if c.addr == "" && sock == "" {
		return errors.New("nothing to listen on: both --addr and --socket are none")
	}
	if c.addr != "" {
		if err := checkExposure(c.addr, c.apiKey); err != nil {
			return err
		}
	}
	// Listen before loading, so that a busy port or a running daemon fails
	// in milliseconds, not after the weights are read.
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	if c.addr != "" {
		l, err := net.Listen("tcp", c.addr)
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("%s is in use (by a kiln daemon? 'kiln status' says): choose another with --addr, or --addr none", c.addr)
		}
		if err != nil {
			return err
		}
		listeners = append(listeners, l)
	}
	if sock != "" {
		l, err := server.ListenUnix(sock, slog.Default())
		if err != nil {
			return err
		}
		listeners = append(listeners, l) // closing it removes the socket while it is still its own
	}

	c.model.conversations = true
	if c.model.stateCache, err = c.stateCache.resolve(); err != nil {
		return err
	}
	lm, err := c.model.load()
	if err != nil {
		return err
	}
	defer lm.sess.Close()
	info := c.model.loadInfo()
	info["backend"], info["model_dir"] = lm.backend, lm.dir
	if len(listeners) > 0 && listeners[0].Addr().Network() == "tcp" {
		info["tcp"] = listeners[0].Addr().String()
	}
	maxBody := c.maxBody
	if maxBody <= 0 {
		maxBody = server.DefaultMaxBody(lm.sess)
	}
	slog.Info("request limits", "max_body", maxBody)
	srv := server.New(lm.sess, server.Options{
		ModelName:      lm.name,
		APIKey:         c.apiKey,
		Defaults:       lm.defaults,
		TokenText:      lm.tokenText,
		Info:           info,
		Models:         newCatalog(),
		Served:         c.model.served(lm.name),
		AllowedOrigins: c.origins,
		AllowedHosts:   c.hosts,
		MaxBodyBytes:   maxBody,
		RequestTimeout: c.requestTimeout,
		WriteTimeout:   c.writeTimeout,
		Logger:         slog.Default(),
	})

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, len(listeners))
	for _, l := range listeners {
		slog.Info("listening", "network", l.Addr().Network(), "addr", l.Addr().String())
		go func() { errc <- srv.Serve(l) }()
	}
	if c.pidFile != "" {
		if err := os.WriteFile(c.pidFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
			return err
		}
		defer removeOwnPIDFile(c.pidFile, os.Getpid())
	}
	var serveErr error
	select {
	case <-ctx.Done():
		slog.Info("draining", "timeout", c.drainTimeout)
	case serveErr = <-errc:
		slog.Error("listener failed; shutting down", "err", serveErr)
	}
	stop() // a second signal kills at once
	dctx, cancel := context.WithTimeout(context.Background(), c.drainTimeout)
	defer cancel()
	if err := srv.Shutdown(dctx); err != nil {
		slog.Warn("shutdown", "err", err)
	}
	slog.Info("stopped")
	return serveErr
}

// listFlag registers a flag of comma-separated items, appended to *dst
// once clean has trimmed them and check has accepted the whole list.
func listFlag(fs *flag.FlagSet, name, usage string, dst *[]string, clean func(string) string, check func([]string) error) {
	fs.Func(name, usage, func(v string) error {
		for _, item := range strings.Split(v, ",") {
			if item = clean(strings.TrimSpace(item)); item != "" {
				*dst = append(*dst, item)
			}
		}
		return check(*dst)
	})
}
