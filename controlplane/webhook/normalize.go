package webhook

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Bounds of a [Normalized] record.
const (
	// MaxStringBytes bounds every string of a Normalized record: the JSON
	// encoding of the string (without its quotes) is at most this long.
	MaxStringBytes = 1 << 10
	// MaxRepositories bounds each repository list of a Normalized record.
	MaxRepositories = 1000
	// MaxRepositoryListBytes bounds the JSON encoding of all repository list
	// entries of one Normalized record taken together.
	MaxRepositoryListBytes = 48 << 10
	// MaxEncodedBytes is the size the JSON encoding of a Normalized record
	// never reaches.
	MaxEncodedBytes = 64 << 10
)

// Event names with a dedicated section in [Normalized].
const (
	EventInstallation             = "installation"
	EventInstallationRepositories = "installation_repositories"
	EventPush                     = "push"
	EventRelease                  = "release"
	EventCheckRun                 = "check_run"
	EventCheckSuite               = "check_suite"
	EventWorkflowRun              = "workflow_run"
	EventPing                     = "ping"
)

// ErrMalformed is returned by [Normalize] when the body is not a JSON object,
// when a field the record needs has the wrong JSON type, or when the event
// name is empty.
var ErrMalformed = errors.New("webhook: malformed payload")

// Normalized is the bounded, typed summary of one webhook delivery that the
// webhook inbox keeps instead of the raw body. Exactly one event section is
// set for a handled event; none is set when Ignored is true.
type Normalized struct {
	// Event is the X-GitHub-Event name.
	Event string `json:"event"`
	// Action is the payload's "action" ("" for events without one, e.g. push).
	Action string `json:"action,omitempty"`
	// Ignored is true for events the control plane records but does not act on.
	Ignored bool `json:"ignored,omitempty"`
	// InstallationID is installation.id, 0 when absent.
	InstallationID int64 `json:"installation_id,omitempty"`
	// RepositoryID is repository.id, 0 when absent.
	RepositoryID int64 `json:"repository_id,omitempty"`
	// RepositoryFullName is repository.full_name ("owner/name").
	RepositoryFullName string `json:"repository_full_name,omitempty"`

	// Installation is set for the installation event.
	Installation *Installation `json:"installation,omitempty"`
	// InstallationRepositories is set for the installation_repositories event.
	InstallationRepositories *InstallationRepositories `json:"installation_repositories,omitempty"`
	// Push is set for the push event.
	Push *Push `json:"push,omitempty"`
	// Release is set for the release event.
	Release *Release `json:"release,omitempty"`
	// CheckRun is set for the check_run event.
	CheckRun *CheckRun `json:"check_run,omitempty"`
	// CheckSuite is set for the check_suite event.
	CheckSuite *CheckSuite `json:"check_suite,omitempty"`
	// WorkflowRun is set for the workflow_run event.
	WorkflowRun *WorkflowRun `json:"workflow_run,omitempty"`
	// Ping is set for the ping event.
	Ping *Ping `json:"ping,omitempty"`
}

// Repository identifies one repository in a repository list.
type Repository struct {
	// ID is the repository's numeric id.
	ID int64 `json:"id"`
	// FullName is "owner/name".
	FullName string `json:"full_name"`
}

// RepositoryList is a bounded list of repositories.
type RepositoryList struct {
	// Repositories holds the first entries of the payload's list, in order.
	Repositories []Repository `json:"repositories,omitempty"`
	// Total is the number of entries in the payload's list.
	Total int `json:"total,omitempty"`
	// Truncated is true when Repositories holds fewer than Total entries.
	Truncated bool `json:"truncated,omitempty"`
}

// Installation is the installation event's section (actions created,
// deleted, suspend, unsuspend, new_permissions_accepted).
type Installation struct {
	// AccountLogin is installation.account.login.
	AccountLogin string `json:"account_login,omitempty"`
	// AccountID is installation.account.id.
	AccountID int64 `json:"account_id,omitempty"`
	// AccountType is installation.account.type ("User" or "Organization").
	AccountType string `json:"account_type,omitempty"`
	// AppID is installation.app_id.
	AppID int64 `json:"app_id,omitempty"`
	// RepositorySelection is "all" or "selected".
	RepositorySelection string `json:"repository_selection,omitempty"`
	// Repositories is the payload's "repositories" list (sent on created).
	Repositories RepositoryList `json:"repositories"`
}

// InstallationRepositories is the installation_repositories event's section
// (actions added, removed).
type InstallationRepositories struct {
	// RepositorySelection is "all" or "selected".
	RepositorySelection string `json:"repository_selection,omitempty"`
	// Added is repositories_added.
	Added RepositoryList `json:"added"`
	// Removed is repositories_removed.
	Removed RepositoryList `json:"removed"`
}

// Push is the push event's section.
type Push struct {
	// Ref is the full ref, e.g. "refs/tags/v1.2.3".
	Ref string `json:"ref"`
	// Before is the SHA the ref pointed to before the push (zeros if created).
	Before string `json:"before,omitempty"`
	// After is the SHA the ref points to after the push (zeros if deleted).
	After string `json:"after,omitempty"`
	// Created is true when the push created the ref.
	Created bool `json:"created,omitempty"`
	// Deleted is true when the push deleted the ref.
	Deleted bool `json:"deleted,omitempty"`
	// Forced is true for a force push.
	Forced bool `json:"forced,omitempty"`
	// DefaultBranch is repository.default_branch.
	DefaultBranch string `json:"default_branch,omitempty"`
}

// Release is the release event's section.
type Release struct {
	// ID is release.id.
	ID int64 `json:"id,omitempty"`
	// TagName is release.tag_name.
	TagName string `json:"tag_name"`
	// TargetCommitish is release.target_commitish.
	TargetCommitish string `json:"target_commitish,omitempty"`
	// Draft is release.draft.
	Draft bool `json:"draft,omitempty"`
	// Prerelease is release.prerelease.
	Prerelease bool `json:"prerelease,omitempty"`
}

// CheckRun is the check_run event's section.
type CheckRun struct {
	// ID is check_run.id.
	ID int64 `json:"id"`
	// Name is check_run.name.
	Name string `json:"name,omitempty"`
	// ExternalID is check_run.external_id (the release-run id for ours).
	ExternalID string `json:"external_id,omitempty"`
	// HeadSHA is check_run.head_sha.
	HeadSHA string `json:"head_sha,omitempty"`
	// Status is check_run.status.
	Status string `json:"status,omitempty"`
	// Conclusion is check_run.conclusion ("" while not completed).
	Conclusion string `json:"conclusion,omitempty"`
	// AppID is check_run.app.id, the app that owns the check run.
	AppID int64 `json:"app_id,omitempty"`
	// RequestedActionIdentifier is requested_action.identifier (action
	// requested_action only).
	RequestedActionIdentifier string `json:"requested_action_identifier,omitempty"`
}

// CheckSuite is the check_suite event's section.
type CheckSuite struct {
	// ID is check_suite.id.
	ID int64 `json:"id,omitempty"`
	// HeadSHA is check_suite.head_sha.
	HeadSHA string `json:"head_sha"`
	// HeadBranch is check_suite.head_branch.
	HeadBranch string `json:"head_branch,omitempty"`
	// Status is check_suite.status.
	Status string `json:"status,omitempty"`
	// Conclusion is check_suite.conclusion.
	Conclusion string `json:"conclusion,omitempty"`
	// AppID is check_suite.app.id.
	AppID int64 `json:"app_id,omitempty"`
}

// WorkflowRun is the workflow_run event's section.
type WorkflowRun struct {
	// ID is workflow_run.id, the id a dispatch with return_run_details returns.
	ID int64 `json:"id"`
	// WorkflowID is workflow_run.workflow_id.
	WorkflowID int64 `json:"workflow_id,omitempty"`
	// Name is the workflow's name.
	Name string `json:"name,omitempty"`
	// Path is the workflow file, e.g. ".github/workflows/release.yml".
	Path string `json:"path,omitempty"`
	// DisplayTitle is the run name ("release 12 attempt 3" for ours).
	DisplayTitle string `json:"display_title,omitempty"`
	// HeadSHA is workflow_run.head_sha.
	HeadSHA string `json:"head_sha,omitempty"`
	// HeadBranch is workflow_run.head_branch (the tag name for a tag ref).
	HeadBranch string `json:"head_branch,omitempty"`
	// TriggerEvent is workflow_run.event, e.g. "workflow_dispatch".
	TriggerEvent string `json:"trigger_event,omitempty"`
	// Status is workflow_run.status.
	Status string `json:"status,omitempty"`
	// Conclusion is workflow_run.conclusion ("" while not completed).
	Conclusion string `json:"conclusion,omitempty"`
	// RunAttempt is workflow_run.run_attempt.
	RunAttempt int64 `json:"run_attempt,omitempty"`
	// RunNumber is workflow_run.run_number.
	RunNumber int64 `json:"run_number,omitempty"`
}

// Ping is the ping event's section.
type Ping struct {
	// Zen is a random GitHub zen sentence.
	Zen string `json:"zen,omitempty"`
	// HookID is the id of the webhook that was pinged.
	HookID int64 `json:"hook_id,omitempty"`
	// AppID is hook.app_id when the hook belongs to an app.
	AppID int64 `json:"app_id,omitempty"`
}

// Payload shapes: only the fields the record needs. Strings that GitHub may
// send as null decode to "".

type idJSON struct {
	ID int64 `json:"id"`
}

type repoJSON struct {
	ID            int64  `json:"id"`
	FullName      string `json:"full_name"`
	DefaultBranch string `json:"default_branch"`
}

type envelopeJSON struct {
	Action       string    `json:"action"`
	Installation *idJSON   `json:"installation"`
	Repository   *repoJSON `json:"repository"`
}

type installationJSON struct {
	Installation *struct {
		Account *struct {
			Login string `json:"login"`
			ID    int64  `json:"id"`
			Type  string `json:"type"`
		} `json:"account"`
		AppID               int64  `json:"app_id"`
		RepositorySelection string `json:"repository_selection"`
	} `json:"installation"`
	Repositories []repoJSON `json:"repositories"`
}

type installationRepositoriesJSON struct {
	RepositorySelection string     `json:"repository_selection"`
	Added               []repoJSON `json:"repositories_added"`
	Removed             []repoJSON `json:"repositories_removed"`
}

type pushJSON struct {
	Ref     string `json:"ref"`
	Before  string `json:"before"`
	After   string `json:"after"`
	Created bool   `json:"created"`
	Deleted bool   `json:"deleted"`
	Forced  bool   `json:"forced"`
}

type releaseJSON struct {
	Release *struct {
		ID              int64  `json:"id"`
		TagName         string `json:"tag_name"`
		TargetCommitish string `json:"target_commitish"`
		Draft           bool   `json:"draft"`
		Prerelease      bool   `json:"prerelease"`
	} `json:"release"`
}

type checkRunJSON struct {
	CheckRun *struct {
		ID         int64   `json:"id"`
		Name       string  `json:"name"`
		ExternalID string  `json:"external_id"`
		HeadSHA    string  `json:"head_sha"`
		Status     string  `json:"status"`
		Conclusion string  `json:"conclusion"`
		App        *idJSON `json:"app"`
	} `json:"check_run"`
	RequestedAction *struct {
		Identifier string `json:"identifier"`
	} `json:"requested_action"`
}

type checkSuiteJSON struct {
	CheckSuite *struct {
		ID         int64   `json:"id"`
		HeadSHA    string  `json:"head_sha"`
		HeadBranch string  `json:"head_branch"`
		Status     string  `json:"status"`
		Conclusion string  `json:"conclusion"`
		App        *idJSON `json:"app"`
	} `json:"check_suite"`
}

type workflowRunJSON struct {
	WorkflowRun *struct {
		ID           int64  `json:"id"`
		WorkflowID   int64  `json:"workflow_id"`
		Name         string `json:"name"`
		Path         string `json:"path"`
		DisplayTitle string `json:"display_title"`
		HeadSHA      string `json:"head_sha"`
		HeadBranch   string `json:"head_branch"`
		Event        string `json:"event"`
		Status       string `json:"status"`
		Conclusion   string `json:"conclusion"`
		RunAttempt   int64  `json:"run_attempt"`
		RunNumber    int64  `json:"run_number"`
	} `json:"workflow_run"`
}

type pingJSON struct {
	Zen    string `json:"zen"`
	HookID int64  `json:"hook_id"`
	Hook   *struct {
		AppID int64 `json:"app_id"`
	} `json:"hook"`
}

// Normalize decodes body, the raw payload of a delivery of the event named
// by the X-GitHub-Event header, into a bounded [Normalized] record. Events
// without a dedicated section are returned with Ignored set. It returns an
// error wrapping [ErrMalformed] when body is not a JSON object, when a field
// the record reads has the wrong JSON type, or when event is empty.
func Normalize(event string, body []byte) (Normalized, error) {
	if event == "" {
		return Normalized{}, fmt.Errorf("%w: empty event name", ErrMalformed)
	}
	if trimmed := bytes.TrimLeft(body, " \t\r\n"); len(trimmed) == 0 || trimmed[0] != '{' {
		return Normalized{}, fmt.Errorf("%w: body is not a JSON object", ErrMalformed)
	}
	var env envelopeJSON
	if err := decode(body, &env); err != nil {
		return Normalized{}, err
	}
	n := Normalized{
		Event:  bound(event),
		Action: bound(env.Action),
	}
	if env.Installation != nil {
		n.InstallationID = env.Installation.ID
	}
	if env.Repository != nil {
		n.RepositoryID = env.Repository.ID
		n.RepositoryFullName = bound(env.Repository.FullName)
	}
	if err := normalizeEvent(&n, event, body, env.Repository); err != nil {
		return Normalized{}, err
	}
	return n, nil
}

func normalizeEvent(n *Normalized, event string, body []byte, repo *repoJSON) error {
	budget := MaxRepositoryListBytes
	switch event {
	case EventInstallation:
		var p installationJSON
		if err := decode(body, &p); err != nil {
			return err
		}
		s := &Installation{Repositories: repositoryList(p.Repositories, &budget)}
		if p.Installation != nil {
			s.AppID = p.Installation.AppID
			s.RepositorySelection = bound(p.Installation.RepositorySelection)
			if a := p.Installation.Account; a != nil {
				s.AccountLogin, s.AccountID, s.AccountType = bound(a.Login), a.ID, bound(a.Type)
			}
		}
		n.Installation = s
	case EventInstallationRepositories:
		var p installationRepositoriesJSON
		if err := decode(body, &p); err != nil {
			return err
		}
		n.InstallationRepositories = &InstallationRepositories{
			RepositorySelection: bound(p.RepositorySelection),
			Added:               repositoryList(p.Added, &budget),
			Removed:             repositoryList(p.Removed, &budget),
		}
	case EventPush:
		var p pushJSON
		if err := decode(body, &p); err != nil {
			return err
		}
		s := &Push{
			Ref: bound(p.Ref), Before: bound(p.Before), After: bound(p.After),
			Created: p.Created, Deleted: p.Deleted, Forced: p.Forced,
		}
		if repo != nil {
			s.DefaultBranch = bound(repo.DefaultBranch)
		}
		n.Push = s
	case EventRelease:
		var p releaseJSON
		if err := decode(body, &p); err != nil {
			return err
		}
		s := &Release{}
		if r := p.Release; r != nil {
			s.ID, s.TagName, s.TargetCommitish = r.ID, bound(r.TagName), bound(r.TargetCommitish)
			s.Draft, s.Prerelease = r.Draft, r.Prerelease
		}
		n.Release = s
	case EventCheckRun:
		var p checkRunJSON
		if err := decode(body, &p); err != nil {
			return err
		}
		s := &CheckRun{}
		if c := p.CheckRun; c != nil {
			s.ID, s.Name, s.ExternalID, s.HeadSHA = c.ID, bound(c.Name), bound(c.ExternalID), bound(c.HeadSHA)
			s.Status, s.Conclusion = bound(c.Status), bound(c.Conclusion)
			if c.App != nil {
				s.AppID = c.App.ID
			}
		}
		if p.RequestedAction != nil {
			s.RequestedActionIdentifier = bound(p.RequestedAction.Identifier)
		}
		n.CheckRun = s
	case EventCheckSuite:
		var p checkSuiteJSON
		if err := decode(body, &p); err != nil {
			return err
		}
		s := &CheckSuite{}
		if c := p.CheckSuite; c != nil {
			s.ID, s.HeadSHA, s.HeadBranch = c.ID, bound(c.HeadSHA), bound(c.HeadBranch)
			s.Status, s.Conclusion = bound(c.Status), bound(c.Conclusion)
			if c.App != nil {
				s.AppID = c.App.ID
			}
		}
		n.CheckSuite = s
	case EventWorkflowRun:
		var p workflowRunJSON
		if err := decode(body, &p); err != nil {
			return err
		}
		s := &WorkflowRun{}
		if w := p.WorkflowRun; w != nil {
			s.ID, s.WorkflowID, s.Name, s.Path = w.ID, w.WorkflowID, bound(w.Name), bound(w.Path)
			s.DisplayTitle, s.HeadSHA, s.HeadBranch = bound(w.DisplayTitle), bound(w.HeadSHA), bound(w.HeadBranch)
			s.TriggerEvent, s.Status, s.Conclusion = bound(w.Event), bound(w.Status), bound(w.Conclusion)
			s.RunAttempt, s.RunNumber = w.RunAttempt, w.RunNumber
		}
		n.WorkflowRun = s
	case EventPing:
		var p pingJSON
		if err := decode(body, &p); err != nil {
			return err
		}
		s := &Ping{Zen: bound(p.Zen), HookID: p.HookID}
		if p.Hook != nil {
			s.AppID = p.Hook.AppID
		}
		n.Ping = s
	default:
		n.Ignored = true
	}
	return nil
}

// decode unmarshals body into v and maps every failure to ErrMalformed. The
// wrapped detail names a JSON type or offset, never payload content beyond a
// single character.
func decode(body []byte, v any) error {
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("%w: %s", ErrMalformed, describe(err))
	}
	return nil
}

func describe(err error) string {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		field := typeErr.Field
		if field == "" {
			field = "(root)"
		}
		return fmt.Sprintf("field %s: JSON %s where %s expected", bound(field), typeErr.Value, typeErr.Type)
	}
	var syntaxErr *json.SyntaxError
	if errors.As(err, &syntaxErr) {
		return fmt.Sprintf("invalid JSON at offset %d", syntaxErr.Offset)
	}
	return "invalid JSON"
}

// repositoryEntryOverhead is the length of the encoding of a Repository
// entry without its id digits and name: {"id":,"full_name":""} plus a
// separating comma.
const repositoryEntryOverhead = len(`{"id":,"full_name":""},`)

// repositoryList keeps the leading entries of repos that fit within
// MaxRepositories entries and the shared byte budget.
func repositoryList(repos []repoJSON, budget *int) RepositoryList {
	l := RepositoryList{Total: len(repos)}
	for _, r := range repos {
		name := bound(r.FullName)
		cost := repositoryEntryOverhead + len(strconv.FormatInt(r.ID, 10)) + encodedLen(name)
		if len(l.Repositories) == MaxRepositories || cost > *budget {
			l.Truncated = true
			break
		}
		*budget -= cost
		l.Repositories = append(l.Repositories, Repository{ID: r.ID, FullName: name})
	}
	return l
}

// bound returns s as valid UTF-8, cut on a rune boundary so that its JSON
// string encoding (without quotes) is at most MaxStringBytes bytes.
func bound(s string) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	n := 0
	for i, r := range s {
		n += encodedRuneLen(r)
		if n > MaxStringBytes {
			return s[:i]
		}
	}
	return s
}

// encodedLen is an upper bound of the length of s once encoded as a JSON
// string by encoding/json (HTML escaping on), without the quotes.
func encodedLen(s string) int {
	n := 0
	for _, r := range s {
		n += encodedRuneLen(r)
	}
	return n
}

func encodedRuneLen(r rune) int {
	switch {
	case r == '"' || r == '\\':
		return 2
	case r == '<' || r == '>' || r == '&' || r < 0x20 || r == 0x7f:
		return 6 // \u00XX
	case r == '\u2028' || r == '\u2029' || r == utf8.RuneError:
		return 6
	default:
		return utf8.RuneLen(r)
	}
}
