package hub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// DefaultEndpoint is the hub kiln downloads from unless HF_ENDPOINT names
// a mirror.
const DefaultEndpoint = "https://huggingface.co"

// Client downloads from a hub into a cache.
type Client struct {
	Endpoint string // the hub's base URL, without a trailing slash
	Token    string // sent as a bearer token to the hub (never to the CDN it redirects to)
	Offline  bool   // HF_HUB_OFFLINE: no requests; Pull only finds what is cached
	Cache    Cache
	HTTP     *http.Client // nil: one with connection and header timeouts and no overall limit
	Parallel int          // files downloaded at once; 0 is 8, as huggingface_hub
	// Attempts bounds the tries of one request or file (a cut connection,
	// a 429 or 5xx, a digest mismatch); 0 is 5. RetryWait is the first
	// pause between them, doubled each time (0 is one second); a 429's
	// Retry-After wins.
	Attempts  int
	RetryWait time.Duration
}

// FromEnv returns a client configured as huggingface_hub is: HF_ENDPOINT,
// HF_TOKEN (or the token `hf auth login` saved), HF_HUB_OFFLINE and the
// cache directory of DefaultCacheDir.
func FromEnv() *Client {
	c := &Client{Endpoint: strings.TrimRight(os.Getenv("HF_ENDPOINT"), "/"), Cache: Cache{Dir: DefaultCacheDir()}}
	if c.Endpoint == "" {
		c.Endpoint = DefaultEndpoint
	}
	c.Token = os.Getenv("HF_TOKEN")
	if c.Token == "" {
		c.Token = os.Getenv("HUGGING_FACE_HUB_TOKEN")
	}
	if c.Token == "" {
		p := os.Getenv("HF_TOKEN_PATH")
		if p == "" {
			p = filepath.Join(hfHome(), "token")
		}
		if b, err := os.ReadFile(expandHome(p)); err == nil {
			c.Token = strings.TrimSpace(string(b))
		}
	}
	switch strings.ToUpper(os.Getenv("HF_HUB_OFFLINE")) {
	case "1", "ON", "YES", "TRUE":
		c.Offline = true
	}
	return c
}

var defaultHTTP = &http.Client{Transport: &http.Transport{
	Proxy:                 http.ProxyFromEnvironment,
	DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
	TLSHandshakeTimeout:   30 * time.Second,
	ResponseHeaderTimeout: 60 * time.Second,
	MaxIdleConnsPerHost:   16,
	IdleConnTimeout:       90 * time.Second,
	ForceAttemptHTTP2:     true,
}}

func (c *Client) http() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return defaultHTTP
}

func (c *Client) attempts() int {
	if c.Attempts > 0 {
		return c.Attempts
	}
	return 5
}

// HTTPError is an error answer of the hub, with the error code and message
// it gives in X-Error-Code and X-Error-Message.
type HTTPError struct {
	Status     int
	Code       string // RepoNotFound, GatedRepo, RevisionNotFound, EntryNotFound, ...
	Message    string
	URL        string
	RetryAfter time.Duration
}

func (e *HTTPError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.Status)
	}
	return fmt.Sprintf("%s: HTTP %d: %s", e.URL, e.Status, msg)
}

// httpError reads an error response.
func httpError(resp *http.Response) *HTTPError {
	e := &HTTPError{Status: resp.StatusCode, Code: resp.Header.Get("X-Error-Code"), Message: resp.Header.Get("X-Error-Message"), URL: resp.Request.URL.Redacted()}
	if e.Message == "" {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		var body struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(b, &body) == nil {
			e.Message = body.Error
		}
	}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s >= 0 {
		e.RetryAfter = time.Duration(min(s, 300)) * time.Second
	}
	return e
}

// retryable reports whether trying again may succeed.
func retryable(err error) bool {
	var he *HTTPError
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return false
	case errors.As(err, &he):
		return he.Status == http.StatusTooManyRequests || he.Status >= 500
	case errors.As(err, new(*DigestError)), errors.As(err, new(*transferError)):
		return true
	}
	// A hub that cannot be reached at all (no route, no DNS) will not be
	// there in a second either; a connection lost midway may be.
	var dns *net.DNSError
	var op *net.OpError
	if errors.As(err, &dns) || errors.As(err, &op) && op.Op == "dial" {
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF)
}

// transferError is a download that ended before its last byte.
type transferError struct{ err error }

func (e *transferError) Error() string { return e.err.Error() }
func (e *transferError) Unwrap() error { return e.err }

// retry calls fn until it succeeds, fails for good, or has been tried
// c.Attempts times; before each retry it calls onRetry (nil: nothing).
func (c *Client) retry(ctx context.Context, onRetry func(error, time.Duration), fn func() error) error {
	wait := c.RetryWait
	if wait <= 0 {
		wait = time.Second
	}
	for attempt := 1; ; attempt++ {
		err := fn()
		if err == nil || !retryable(err) || attempt == c.attempts() || ctx.Err() != nil {
			return err
		}
		pause := wait
		var he *HTTPError
		if errors.As(err, &he) && he.Status == http.StatusTooManyRequests && he.RetryAfter > 0 {
			pause = he.RetryAfter
		}
		if onRetry != nil {
			onRetry(err, pause)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pause):
		}
		wait *= 2
	}
}

// request builds a request to the hub; the token goes only to the hub's
// own host.
func (c *Client) request(ctx context.Context, method, u string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("User-Agent", "kiln (+https://github.com/kiln-llm/kiln)")
	// Identity: sizes and ranges are of the file's bytes, not a compressed
	// stream's (and Go would otherwise ask for gzip and decode it).
	req.Header.Set("Accept-Encoding", "identity")
	if c.Token != "" && sameHost(u, c.Endpoint) {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	return req, nil
}

func sameHost(a, b string) bool {
	ua, err1 := url.Parse(a)
	ub, err2 := url.Parse(b)
	return err1 == nil && err2 == nil && ua.Host == ub.Host
}

// RepoInfo is what the hub's model API says of a repository at a revision.
type RepoInfo struct {
	ID       string    `json:"id"`
	SHA      string    `json:"sha"` // the commit the revision resolves to
	Siblings []Sibling `json:"siblings"`
}

// Sibling is a file of a repository.
type Sibling struct {
	Name   string `json:"rfilename"`
	Size   int64  `json:"size"`
	BlobID string `json:"blobId"`
	LFS    *struct {
		SHA256 string `json:"sha256"`
		Size   int64  `json:"size"`
	} `json:"lfs"`
}

// Info asks the hub for a repository's files at a revision
// (GET /api/models/ID/revision/REV?blobs=true).
func (c *Client) Info(ctx context.Context, repo, rev string) (*RepoInfo, error) {
	if c.Offline {
		return nil, ErrOffline
	}
	u := c.Endpoint + "/api/models/" + repo + "/revision/" + url.PathEscape(rev) + "?blobs=true"
	var info RepoInfo
	err := c.retry(ctx, nil, func() error {
		req, err := c.request(ctx, http.MethodGet, u)
		if err != nil {
			return err
		}
		resp, err := c.http().Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return httpError(resp)
		}
		info = RepoInfo{}
		if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&info); err != nil {
			return fmt.Errorf("%s: reading the hub's answer: %w", u, err)
		}
		return nil
	})
	if err != nil {
		return nil, c.explain(Ref{Repo: repo, Revision: rev}, "", err)
	}
	if !commitHash.MatchString(info.SHA) {
		return nil, fmt.Errorf("%s: the hub's answer has no commit id (sha %q): is %s a Hugging Face hub?", u, info.SHA, c.Endpoint)
	}
	return &info, nil
}

// ErrOffline is what a request fails with when HF_HUB_OFFLINE is set.
var ErrOffline = errors.New("HF_HUB_OFFLINE is set: kiln makes no requests to the hub")

// explain turns a hub error into what the user must do about it.
func (c *Client) explain(ref Ref, file string, err error) error {
	var he *HTTPError
	if !errors.As(err, &he) {
		return err
	}
	page := c.Endpoint + "/" + ref.Repo
	switch {
	case he.Code == "GatedRepo":
		if c.Token == "" {
			return fmt.Errorf("%s is gated: accept its terms at %s, then set HF_TOKEN to a token of that account (%w)", ref.Repo, page, err)
		}
		return fmt.Errorf("%s is gated and the hub refused HF_TOKEN: accept its terms at %s with the token's account (%w)", ref.Repo, page, err)
	case he.Code == "RevisionNotFound":
		return fmt.Errorf("%s has no revision %q (%w)", ref.Repo, ref.rev(), err)
	case he.Code == "EntryNotFound":
		return fmt.Errorf("%s has no file %s at %s (%w)", ref.Repo, file, ref.rev(), err)
	case he.Code == "RepoNotFound" || he.Status == http.StatusUnauthorized || he.Status == http.StatusNotFound:
		if c.Token == "" {
			return fmt.Errorf("%s was not found on %s (a private repository needs HF_TOKEN) (%w)", ref.Repo, c.Endpoint, err)
		}
		return fmt.Errorf("%s was not found on %s, or HF_TOKEN cannot read it (%w)", ref.Repo, c.Endpoint, err)
	case he.Status == http.StatusForbidden:
		return fmt.Errorf("the hub refused access to %s: check HF_TOKEN's permissions (%w)", ref.Repo, err)
	case he.Status == http.StatusTooManyRequests:
		return fmt.Errorf("the hub is rate-limiting these requests; wait and run the pull again (a token, HF_TOKEN, gets higher limits) (%w)", err)
	}
	return err
}
