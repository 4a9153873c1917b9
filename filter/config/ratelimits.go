package config

import (
	"strconv"
	"strings"
)

// The rate limits and their actions: the descriptors of a request.

func rateLimits(v value, field string) ([]RateLimit, error) {
	if v.kind != kindArray {
		return nil, &FieldError{field, "must be an array, not " + v.kind.String()}
	}
	if len(v.items) == 0 {
		return nil, &FieldError{field, "must hold at least one rate limit"}
	}
	if len(v.items) > MaxRateLimits {
		return nil, &FieldError{field, "must hold at most " + strconv.Itoa(MaxRateLimits) + " rate limits"}
	}
	out := make([]RateLimit, len(v.items))
	for i, item := range v.items {
		path := field + "[" + strconv.Itoa(i) + "]"
		o, err := asObject(item, path)
		if err != nil {
			return nil, err
		}
		if err := o.only(rateLimitFields...); err != nil {
			return nil, err
		}
		out[i].HitsAddend = 1
		if v, ok := o.get("hits_addend"); ok {
			n, err := integer(v, o.path("hits_addend"), 1, 1<<32-1)
			if err != nil {
				return nil, err
			}
			out[i].HitsAddend = uint32(n)
		}
		av, ok := o.get("actions")
		if !ok {
			return nil, &FieldError{o.path("actions"), "is required"}
		}
		if out[i].Actions, err = actions(av, o.path("actions")); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func actions(v value, field string) ([]Action, error) {
	if v.kind != kindArray {
		return nil, &FieldError{field, "must be an array, not " + v.kind.String()}
	}
	if len(v.items) == 0 {
		return nil, &FieldError{field, "must hold at least one action"}
	}
	if len(v.items) > MaxActions {
		return nil, &FieldError{field, "must hold at most " + strconv.Itoa(MaxActions) + " actions"}
	}
	out := make([]Action, len(v.items))
	for i, item := range v.items {
		path := field + "[" + strconv.Itoa(i) + "]"
		o, err := asObject(item, path)
		if err != nil {
			return nil, err
		}
		if len(o.v.members) != 1 {
			return nil, &FieldError{path, "must have exactly one of remote_address, request_headers, path, method, generic_key"}
		}
		m := o.v.members[0]
		body, err := asObject(m.value, o.path(m.name))
		if err != nil {
			return nil, err
		}
		a := &out[i]
		switch m.name {
		case "remote_address":
			a.Kind = RemoteAddress
			err = body.keyOnly(a, DefaultRemoteAddressKey)
		case "path":
			a.Kind = Path
			err = body.keyOnly(a, DefaultPathKey)
		case "method":
			a.Kind = Method
			err = body.keyOnly(a, DefaultMethodKey)
		case "generic_key":
			a.Kind = GenericKey
			err = body.genericKey(a)
		case "request_headers":
			a.Kind = RequestHeader
			err = body.requestHeaders(a)
		default:
			return nil, &FieldError{o.path(m.name), "is not a known action (remote_address, request_headers, path, method, generic_key)"}
		}
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (o object) keyOnly(a *Action, def string) error {
	if err := o.only(actionFieldsOf(a.Kind)...); err != nil {
		return err
	}
	return o.descriptorKey(a, def)
}

func (o object) descriptorKey(a *Action, def string) error {
	a.DescriptorKey = def
	if v, ok := o.get("descriptor_key"); ok {
		var err error
		if a.DescriptorKey, err = nonEmptyString(v, o.path("descriptor_key")); err != nil {
			return err
		}
	}
	return nil
}

func (o object) genericKey(a *Action) error {
	if err := o.only(actionFieldsOf(GenericKey)...); err != nil {
		return err
	}
	var err error
	if a.DescriptorValue, err = o.requiredString("descriptor_value"); err != nil {
		return err
	}
	return o.descriptorKey(a, DefaultGenericKey)
}

func (o object) requestHeaders(a *Action) error {
	if err := o.only(actionFieldsOf(RequestHeader)...); err != nil {
		return err
	}
	name, err := o.requiredString("header_name")
	if err != nil {
		return err
	}
	if !validHeaderName(name) {
		return &FieldError{o.path("header_name"), "is not a valid header name: " + strconv.Quote(name)}
	}
	a.HeaderName = strings.ToLower(name)
	if a.DescriptorKey, err = o.requiredString("descriptor_key"); err != nil {
		return err
	}
	if v, ok := o.get("skip_if_absent"); ok {
		if a.SkipIfAbsent, err = asBool(v, o.path("skip_if_absent")); err != nil {
			return err
		}
	}
	return nil
}

// actionFieldsOf returns the fields of the action of kind k.
func actionFieldsOf(k ActionKind) []string {
	name := map[ActionKind]string{RemoteAddress: "remote_address", RequestHeader: "request_headers", Path: "path",
		Method: "method", GenericKey: "generic_key"}[k]
	for _, a := range actionFields {
		if a.name == name {
			return a.fields
		}
	}
	return nil
}

// validHeaderName accepts an HTTP token, optionally with a leading ':' for
// the HTTP/2 pseudo-headers (:authority, :path, ...).
func validHeaderName(s string) bool {
	s = strings.TrimPrefix(s, ":")
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
