package ollama

import (
	"fmt"
	"path/filepath"
	"strings"
)

// Name is an Ollama model name: [HOST/][NAMESPACE/]MODEL[:TAG], with
// Ollama's defaults registry.ollama.ai, library and latest.
type Name struct {
	Host, Namespace, Model, Tag string
}

// The defaults of a name's parts, as Ollama fills them in.
const (
	DefaultHost      = "registry.ollama.ai"
	DefaultNamespace = "library"
	DefaultTag       = "latest"
)

// ParseName parses s as Ollama does and fills in the defaults. Each part
// must be what Ollama accepts, so that a name never reaches outside the
// store's manifests directory.
func ParseName(s string) (Name, error) {
	var n Name
	rest := s
	if i := strings.LastIndex(rest, ":"); i > strings.LastIndex(rest, "/") {
		rest, n.Tag = rest[:i], rest[i+1:]
		if n.Tag == "" {
			return Name{}, fmt.Errorf("Ollama name %q: empty tag after :", s)
		}
	}
	parts := strings.Split(rest, "/")
	switch len(parts) {
	case 1:
		n.Model = parts[0]
	case 2:
		n.Namespace, n.Model = parts[0], parts[1]
	case 3:
		n.Host, n.Namespace, n.Model = parts[0], parts[1], parts[2]
	default:
		return Name{}, fmt.Errorf("Ollama name %q: want [HOST/][NAMESPACE/]MODEL[:TAG]", s)
	}
	if n.Host == "" {
		n.Host = DefaultHost
	}
	if n.Namespace == "" && len(parts) == 1 {
		n.Namespace = DefaultNamespace
	}
	if n.Tag == "" {
		n.Tag = DefaultTag
	}
	if err := n.check(); err != nil {
		return Name{}, fmt.Errorf("Ollama name %q: %w", s, err)
	}
	return n, nil
}

// check applies Ollama's rules to each part: letters, digits and _ first;
// then also - (and . in all but the namespace, : in the host); bounded
// lengths.
func (n Name) check() error {
	for _, p := range []struct {
		what, s, extra string
		maxLen         int
	}{
		{"host", n.Host, "-_.:", 350},
		{"namespace", n.Namespace, "-_", 80},
		{"model", n.Model, "-_.", 80},
		{"tag", n.Tag, "-_.", 80},
	} {
		if p.s == "" || len(p.s) > p.maxLen {
			return fmt.Errorf("%s %q is empty or too long", p.what, p.s)
		}
		for i, c := range p.s {
			alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_'
			if !alnum && (i == 0 || !strings.ContainsRune(p.extra, c)) {
				return fmt.Errorf("%s %q: %q is not allowed there", p.what, p.s, c)
			}
		}
	}
	return nil
}

// String is the name as Ollama shows it: without the default host and
// namespace, always with its tag (qwen3:8b, user/model:tag).
func (n Name) String() string {
	var b strings.Builder
	if !strings.EqualFold(n.Host, DefaultHost) {
		b.WriteString(n.Host + "/" + n.Namespace + "/")
	} else if !strings.EqualFold(n.Namespace, DefaultNamespace) {
		b.WriteString(n.Namespace + "/")
	}
	b.WriteString(n.Model + ":" + n.Tag)
	return b.String()
}

func (n Name) parts() []string { return []string{n.Host, n.Namespace, n.Model, n.Tag} }

// path is the manifest's path under manifests/.
func (n Name) path() string { return filepath.Join(n.parts()...) }
