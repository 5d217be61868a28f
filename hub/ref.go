// Package hub downloads models from the Hugging Face hub into its shared
// cache, laid out exactly as huggingface_hub lays it out, so that kiln,
// transformers, vLLM and `hf download` use each other's files:
//
//	$HF_HUB_CACHE/models--ORG--NAME/
//	    blobs/ETAG                  file contents, named by their sha256 (LFS files) or git blob id
//	    blobs/ETAG.incomplete       a download in progress, resumed by HTTP Range
//	    snapshots/COMMIT/FILE       relative symlinks to ../../blobs/ETAG
//	    refs/main                   the commit a branch or tag last resolved to
//	$HF_HUB_CACHE/.locks/models--ORG--NAME/ETAG.lock
//
// Every file is verified against the hub's digest before it is linked into a
// snapshot; concurrent pulls of one file (in this process or another) take the
// blob's lock in turn, so none ever sees a torn file.
package hub

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Ref names a model on the hub: "Org/Name", optionally "@revision" (a
// branch, tag or commit) and, for a repository of GGUF files, ":QUANT", the
// quantization whose file to take ("Qwen/Qwen3-8B-GGUF:Q4_K_M"). Ollama's
// spelling of hub models, "hf.co/Org/Name:QUANT", is accepted too.
type Ref struct {
	Repo     string // "Qwen/Qwen3-8B"
	Revision string // "" is the default branch, main
	Quant    string // "" is the repository's safetensors, or its default GGUF file
}

// DefaultRevision is the branch a Ref without a revision names.
const DefaultRevision = "main"

var (
	// repoPart is one half of a repository id, as the hub allows them.
	repoPart = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,95}$`)
	// quantTag is a GGUF quantization name as repositories spell them in
	// file names: Q4_K_M, IQ4_XS, UD-Q4_K_XL, BF16.
	quantTag = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$`)
	// commitHash is a full git commit id, shortCommit an abbreviated one.
	commitHash  = regexp.MustCompile(`^[0-9a-f]{40}$`)
	shortCommit = regexp.MustCompile(`^[0-9a-f]{7,39}$`)
)

// ParseRef parses s as a hub reference. It accepts only what could name a
// repository on the hub: two parts, no "--" or "..", no path tricks.
func ParseRef(s string) (Ref, error) {
	in := s
	for _, p := range []string{"https://huggingface.co/", "huggingface.co/", "hf.co/"} {
		s = strings.TrimPrefix(s, p)
	}
	var r Ref
	repo, rest := s, ""
	if i := strings.IndexAny(s, "@:"); i >= 0 {
		repo, rest = s[:i], s[i:]
	}
	if after, ok := strings.CutPrefix(rest, "@"); ok {
		r.Revision, r.Quant, _ = strings.Cut(after, ":")
		if r.Revision == "" {
			return Ref{}, fmt.Errorf("hub reference %q: empty revision after @", in)
		}
		if err := checkRevision(r.Revision); err != nil {
			return Ref{}, fmt.Errorf("hub reference %q: %w", in, err)
		}
	} else if rest != "" {
		r.Quant = rest[1:]
		if strings.Contains(r.Quant, "@") {
			return Ref{}, fmt.Errorf("hub reference %q: the revision goes before the quantization (Org/Name@REV:QUANT)", in)
		}
	}
	if rest != "" && strings.HasSuffix(rest, ":") {
		return Ref{}, fmt.Errorf("hub reference %q: empty quantization after :", in)
	}
	if r.Quant != "" && !quantTag.MatchString(r.Quant) {
		return Ref{}, fmt.Errorf("hub reference %q: %q is not a quantization name such as Q4_K_M", in, r.Quant)
	}
	org, name, ok := strings.Cut(repo, "/")
	if !ok || strings.Contains(name, "/") {
		return Ref{}, fmt.Errorf("hub reference %q: want ORG/NAME, as in Qwen/Qwen3-8B", in)
	}
	for _, p := range []string{org, name} {
		// As the hub: no "--" or "..", no "-" or "." at either end (which
		// also keeps the cache's folder name, models--ORG--NAME, one way
		// to read).
		if !repoPart.MatchString(p) || strings.Contains(p, "--") || strings.Contains(p, "..") || strings.TrimRight(p, ".-") != p {
			return Ref{}, fmt.Errorf("hub reference %q: %q is not a valid repository name", in, p)
		}
	}
	r.Repo = repo
	return r, nil
}

// checkRevision refuses revisions that could leave the refs directory.
func checkRevision(rev string) error {
	// Git refs hold no ".." anywhere (git check-ref-format), and no
	// component of the cache's snapshot path may be "." or "..".
	if strings.HasPrefix(rev, "/") || strings.Contains(rev, "\\") || strings.Contains(rev, "..") {
		return fmt.Errorf("revision %q is not a branch, tag or commit", rev)
	}
	for _, p := range strings.Split(rev, "/") {
		if p == "" || p == "." || strings.ContainsAny(p, "\x00\n") {
			return fmt.Errorf("revision %q is not a branch, tag or commit", rev)
		}
	}
	return nil
}

// String returns the reference as ParseRef reads it.
func (r Ref) String() string {
	s := r.Repo
	if r.Revision != "" {
		s += "@" + r.Revision
	}
	if r.Quant != "" {
		s += ":" + r.Quant
	}
	return s
}

// rev is the revision to resolve: the one given, or main.
func (r Ref) rev() string {
	if r.Revision == "" {
		return DefaultRevision
	}
	return r.Revision
}

// FolderName is the cache folder of a model repository: models--ORG--NAME.
func FolderName(repo string) string {
	return "models--" + strings.ReplaceAll(repo, "/", "--")
}

// repoOfFolder is the inverse of FolderName ("" for other folders).
func repoOfFolder(folder string) string {
	rest, ok := strings.CutPrefix(folder, "models--")
	if !ok {
		return ""
	}
	org, name, ok := strings.Cut(rest, "--")
	if !ok || org == "" || name == "" || strings.Contains(name, "--") {
		return ""
	}
	return org + "/" + name
}

// ErrNotCached is the cause of a Find that found nothing in the cache.
var ErrNotCached = errors.New("not in the Hugging Face cache")
