{
  description = "Test stand-in for numtide/flake-utils (offline mock evaluation only)";

  outputs =
    { self }:
    let
      # eachSystem [ "s1" "s2" ] (system: { packages = X; }) ==
      #   { packages = { s1 = X[s1]; s2 = X[s2]; }; }
      eachSystem =
        systems: perSystem:
        builtins.foldl' (
          acc: system:
          let
            result = perSystem system;
          in
          acc
          // builtins.mapAttrs (output: value: (acc.${output} or { }) // { ${system} = value; }) result
        ) { } systems;
    in
    {
      lib = { inherit eachSystem; };
    };
}
