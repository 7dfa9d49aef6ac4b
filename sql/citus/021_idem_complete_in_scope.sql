-- idem_complete_in_scope (Citus only): idem_complete, delegated to the worker that holds the
-- claim's shard. Why: the handler's business writes run as the app's role, and idem_complete is
-- SECURITY DEFINER; in one transaction Citus refuses to reach placements the app's role modified
-- over a connection of another role ("cannot perform query on placements that were modified in
-- this transaction by a different user"), which a colocated handler always hits. A call of this
-- function at the top of a statement is sent by the coordinator, as the app's role, over the
-- connection that carried the handler's writes (create_distributed_function, force_delegation);
-- on the worker idem_complete then runs locally, as its owner, in the same transaction: one
-- worker, no two-phase commit. The shim calls it where it exists (idem_shim.store.Store.complete);
-- p_scope is the claim's scope (idem_key_scope(p_key_id): key_id >> 31), which routes the call.
-- idem_complete reads the claim-token secret there, so idem_secret becomes a reference table (a
-- copy on each node, readable by the owner only, as on the coordinator), and the helpers that
-- read it are sent to every node.
-- Citus delegates no call while a worker's copy of the metadata is stale: after citus_update_node
-- (pg_auto_failover promoting a worker's standby) until the coordinator's maintenance daemon has
-- sent it again, tens of seconds under load. The call then runs on the coordinator, where a
-- handler's own writes make idem_complete fail: that is the store not ready (57P03, the shim's
-- 503 with the claim left in flight), never the handler's failure.
CREATE OR REPLACE FUNCTION public.idem_complete_in_scope(
    p_scope             integer,
    p_key_id            bigint,
    p_response_code     integer,
    p_response_body     jsonb,
    p_response_key      text  DEFAULT NULL,
    p_response_headers  jsonb DEFAULT NULL,
    p_claim_token       text  DEFAULT NULL
)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- GUARD: the scope routes the call; another scope would send it to a worker without the row
    -- (idem_key_scope's rule, written out: this function runs as its caller, who may not call it)
    IF p_scope::bigint IS DISTINCT FROM (p_key_id >> 31) THEN
        RAISE EXCEPTION USING ERRCODE = 'IDM00',
            MESSAGE = pg_catalog.format('idem_complete_in_scope: p_scope %s is not the scope of key_id %s',
                                        p_scope, p_key_id);
    END IF;
    IF NOT pg_catalog.citus_is_coordinator() THEN  -- delegated, as it should be
        PERFORM public.idem_complete(p_key_id, p_response_code, p_response_body, p_response_key,
                                     p_response_headers, p_claim_token);
        RETURN;
    END IF;
    -- GUARD: not delegated (the workers' metadata is stale): without writes of the caller's role
    -- in this transaction the completion runs here too; after them Citus refuses it (25001)
    BEGIN
        PERFORM public.idem_complete(p_key_id, p_response_code, p_response_body, p_response_key,
                                     p_response_headers, p_claim_token);
    EXCEPTION WHEN active_sql_transaction THEN
        RAISE EXCEPTION USING ERRCODE = '57P03',
            MESSAGE = pg_catalog.format('idem_complete_in_scope: the coordinator cannot hand this completion to '
                                        'the claim''s worker now (scope %s): the workers'' copy of the Citus '
                                        'metadata is being sent again after a change of nodes', p_scope),
            HINT = 'retry: the claim is still in flight, and its retry replays or, after the stale window, runs once';
    END;
END
$$;

COMMENT ON FUNCTION public.idem_complete_in_scope IS
    'Distributed store (Citus) only: idem_complete(p_key_id, ...) run on the worker holding the claim''s '
    'shard, in the caller''s transaction, so that a handler''s writes (as the app''s role) and the completion '
    'commit on one worker. p_scope must be idem_key_scope(p_key_id). Errors: those of idem_complete; IDM00 '
    'when p_scope is not the key_id''s scope; 57P03 when Citus cannot delegate the call now (a worker''s '
    'metadata is stale after a change of nodes) and the caller''s own writes keep it off the coordinator.';
REVOKE ALL ON FUNCTION public.idem_complete_in_scope FROM PUBLIC;
GRANT EXECUTE ON FUNCTION public.idem_complete_in_scope TO idem_app;

DO $idem_delegate$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition
                    WHERE logicalrelid = 'public.idem_secret'::pg_catalog.regclass) THEN
        PERFORM create_reference_table('public.idem_secret');
    END IF;
    -- The helpers that read the secret are SQL-standard bodies, so they depend on it: Citus sends
    -- them to the workers (where the delegated completion calls them) once it is a reference table.
    PERFORM create_distributed_function('public.idem_claim_token(bigint,timestamptz)');
    PERFORM create_distributed_function('public.idem_caller_is(text)');
    PERFORM create_distributed_function(
        'public.idem_complete_in_scope(integer,bigint,integer,jsonb,text,jsonb,text)',
        distribution_arg_name => 'p_scope', colocate_with => 'public.idempotency_keys', force_delegation => true);
END
$idem_delegate$;
