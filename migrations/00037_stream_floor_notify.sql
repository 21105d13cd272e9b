-- +goose Up
-- A row claimer hears when a switched-back queue's stream floor moves
-- (docs/batch-storage.md "Per-key order across a switch back to rows").
-- Migration 00034 holds the ordered effects of a queue whose storage went
-- from batch back to rows behind its stream's unsettled effects
-- (pgoutbox.stream_floor), but nothing told a row claimer when a page of
-- that stream settled: a held effect waited for the claim loop's next poll
-- (PollInterval, 1 s, on an idle queue), unless the settle happened to
-- move an effect into pgoutbox.effects, whose insert notifies.
--
-- A settle that moves a batch's settled position (done_through) or ends it
-- (done_at) now notifies the queue's channel when the queue is so marked
-- (queue_storage.left_batch_at): one probe of queue_storage per settled
-- page, and no notification for a queue of batch storage, whose pages need
-- none. As every notification of the engine, it is sent at commit, and
-- identical ones of a transaction are folded into one.

-- +goose StatementBegin
CREATE FUNCTION pgoutbox.stream_floor_notify() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pgoutbox.queue_storage q
               WHERE q.queue = NEW.queue AND q.storage = 'rows' AND q.left_batch_at IS NOT NULL) THEN
        PERFORM pg_notify('pgoutbox_effects', NEW.queue);
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

REVOKE ALL ON FUNCTION pgoutbox.stream_floor_notify() FROM PUBLIC;

CREATE TRIGGER stream_batches_floor_notify AFTER UPDATE ON pgoutbox.stream_batches
    FOR EACH ROW WHEN (OLD.done_through IS DISTINCT FROM NEW.done_through
                       OR (OLD.done_at IS NULL AND NEW.done_at IS NOT NULL))
    EXECUTE FUNCTION pgoutbox.stream_floor_notify();

-- +goose Down
DROP TRIGGER stream_batches_floor_notify ON pgoutbox.stream_batches;
DROP FUNCTION pgoutbox.stream_floor_notify();
