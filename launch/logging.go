package launch

import "log/slog"

// ReplaceDurations is a slog.HandlerOptions.ReplaceAttr that writes every
// time.Duration attribute as its Go duration string ("1.5s", "250ms")
// instead of what log/slog's JSON handler writes for one, an integer of
// nanoseconds; log/slog's text handler already writes the string, so a
// log reads the same in either format. Every logger the SDK's commands,
// examples and test workers create uses it; give it to a worker's own JSON
// handler too:
//
//	slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{ReplaceAttr: launch.ReplaceDurations})
//
// Attributes of other kinds are returned unchanged. To chain it with a
// ReplaceAttr of your own, call it first: ReplaceDurations(groups, a).
func ReplaceDurations(groups []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}
