package metrics

import "strings"

// ClassOf is the lock class of a resource, the one meaning of "lock class"
// across shardlock: the resource's namespace, the part before its first
// ':' (or brace), without braces, and ClassDefault for a resource that has
// none. "order:123" and "{order:123}:stock" are both "order"; "invoice-7"
// is "default". It is the library's class when neither WithClass nor
// WithClassFunc names one, the exporter's class of a lock key it scans, and
// what the shardlock tool's "list -class" matches. A namespace is never a
// lock's own name, so a resource never becomes a label; the metrics' class
// cap (Options.MaxClasses) bounds the rest.
func ClassOf(resource string) string {
	r := strings.TrimLeft(resource, "{")
	i := strings.IndexAny(r, ":{}")
	if i <= 0 {
		return ClassDefault
	}
	return r[:i]
}
