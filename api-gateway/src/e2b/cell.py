# Warren's run_code cell: runs the code as a fresh __main__ and, like a
# Jupyter cell, reports the value of a last expression and an uncaught
# exception; the report follows MARK on stdout, which the gateway strips.
def __warren_cell(src, mark):
    import ast, json, linecache, sys, traceback
    out = {}
    # Tracebacks show the cell's lines, and start at them.
    linecache.cache["<cell>"] = (len(src), None, src.splitlines(True), "<cell>")
    try:
        tree = ast.parse(src, "<cell>", "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        g = {"__name__": "__main__", "__builtins__": __builtins__}
        exec(compile(tree, "<cell>", "exec"), g)
        if last is not None:
            value = eval(compile(last, "<cell>", "eval"), g)
            if value is not None:
                out["result"] = repr(value)
    except SystemExit:
        raise
    except BaseException as e:
        value = str(e)
        if isinstance(e, NameError):
            value += " (Warren runs each run_code in a fresh interpreter: variables of earlier calls are not kept; files in the home are)"
        out["error"] = {"name": type(e).__name__, "value": value, "traceback": "".join(traceback.format_exception(type(e), e, e.__traceback__.tb_next))}
    sys.stdout.flush()
    sys.stderr.flush()
    sys.stdout.write(mark + json.dumps(out) + "\n")
    sys.stdout.flush()
